"""Image refs and strings through a CLIP backbone, in order, batch by batch: the one encoding
loop behind end-of-epoch evaluation and checkpoint evaluation. With a PrefixCache, a tower with a
frozen prefix (the backbone's `frozen_depth`, vacsr/model/frozen.py) reads the prefix's outputs
from the cache (vacsr/model/prefix_cache.py) and runs only the blocks above it; a tower without
one (depth 0) is encoded whole."""
from __future__ import annotations

import hashlib
from contextlib import nullcontext
from typing import Callable, Iterator, Sequence

import torch

from vacsr.data.loader import image_loader
from vacsr.model import prefix as tower_prefix
from vacsr.model.prefix_cache import PrefixCache, image_inputs_digest


def _device(backbone) -> torch.device:
    return next(backbone.parameters()).device


def _precision(autocast, device: torch.device) -> str:
    """What the prefix's numbers depend on besides the weights: autocast's dtype, or fp32."""
    with autocast():
        if torch.is_autocast_enabled(device.type):
            return str(torch.get_autocast_dtype(device.type))
    return "float32"


def _through_cache(cache: PrefixCache | None, backbone, tower: str, depth: int,
                   inputs: str | None, count: int, batches: Callable[[], Iterator[torch.Tensor]],
                   autocast, device: torch.device) -> tuple[int, torch.Tensor | None]:
    """(depth, the cached prefix outputs of the `depth` frozen blocks) or (0, None) when the pass
    goes without the cache."""
    if cache is None or inputs is None or not count:
        if cache is not None:
            cache.stats.uncached += count
        return 0, None
    tokens = cache.prefix_outputs(backbone, tower, depth, inputs, count, batches,
                                  _precision(autocast, device), device)
    return (depth, tokens) if tokens is not None else (0, None)


@torch.no_grad()
def encode_images(backbone, images: Sequence, *, batch_size: int = 256, num_workers: int = 0,
                  autocast=nullcontext, keep_on_device: bool = False,
                  cache: PrefixCache | None = None) -> torch.Tensor:
    """(N, d) float32 features of `images` with the backbone's evaluation preprocessing; on the
    backbone's device when `keep_on_device`, else gathered on the CPU chunk by chunk (large sets
    must not pile up in GPU memory)."""
    device, was_training = _device(backbone), backbone.training
    backbone.eval()

    cacheable = backbone.frozen_depth("image") if cache is not None else 0

    def loader():
        return image_loader(images, backbone.eval_transform, batch_size=batch_size,
                            num_workers=num_workers, device=device)

    def prefix_batches():
        for batch, _ in loader():
            with autocast():
                yield tower_prefix.image_prefix(backbone, batch.to(device), cacheable)

    chunks = []
    try:
        inputs = image_inputs_digest(images) if cacheable else None
        depth, tokens = _through_cache(cache, backbone, "image", cacheable, inputs, len(images),
                                       prefix_batches, autocast, device)
        if tokens is not None:
            batches = (tokens[i:i + batch_size] for i in range(0, len(tokens), batch_size))
        else:
            batches = (batch for batch, _ in loader())
        for batch in batches:
            with autocast():
                batch = batch.to(device, non_blocking=True)
                feats = (tower_prefix.image_suffix(backbone, batch, depth) if depth
                         else backbone.encode_image(batch)).float()
            chunks.append(feats if keep_on_device else feats.cpu())  # (b, d)
    finally:
        backbone.train(was_training)
    return torch.cat(chunks)  # (N, d)


def _tokens_digest(tokens: torch.Tensor) -> str:
    return hashlib.sha256(tokens.cpu().numpy().tobytes()).hexdigest()


@torch.no_grad()
def encode_texts(backbone, texts: Sequence[str], *, batch_size: int = 1024,
                 autocast=nullcontext, keep_on_device: bool = False,
                 cache: PrefixCache | None = None,
                 encoder: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """(N, d) float32 features of `texts` (tokenized by the backbone), placed as encode_images.
    `encoder`: token ids (b, T) -> features (b, d) where not the backbone's own (a head's learned
    prompt context, vacsr/model/clip_heads.py); such a pass goes without the cache."""
    device, was_training = _device(backbone), backbone.training
    backbone.eval()
    tokens = backbone.tokenize(list(texts))  # (N, T)
    starts = range(0, len(texts), batch_size)
    cacheable = backbone.frozen_depth("text") if cache is not None and encoder is None else 0
    encoder = encoder or backbone.encode_text

    def prefix_batches():
        for start in starts:
            with autocast():
                yield tower_prefix.text_prefix(
                    backbone, tokens[start:start + batch_size].to(device), cacheable)

    chunks = []
    try:
        inputs = _tokens_digest(tokens) if cacheable else None
        depth, hidden = _through_cache(cache, backbone, "text", cacheable, inputs, len(texts),
                                       prefix_batches, autocast, device)
        for start in starts:
            part = tokens[start:start + batch_size].to(device)
            with autocast():
                if depth:
                    feats = tower_prefix.text_suffix(
                        backbone, hidden[start:start + batch_size].to(device), part, depth)
                else:
                    feats = encoder(part)
            chunks.append(feats.float() if keep_on_device else feats.float().cpu())  # (b, d)
    finally:
        backbone.train(was_training)
    return torch.cat(chunks)  # (N, d)
