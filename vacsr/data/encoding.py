"""Image refs and strings through a CLIP backbone, in order, batch by batch: the one encoding
loop behind end-of-epoch evaluation and the frozen-backbone feature cache."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Sequence

import torch

from vacsr.data.loader import image_loader


def _device(backbone) -> torch.device:
    return next(backbone.parameters()).device


@torch.no_grad()
def encode_images(backbone, images: Sequence, *, batch_size: int = 256, num_workers: int = 0,
                  autocast=nullcontext, keep_on_device: bool = False) -> torch.Tensor:
    """(N, d) float32 features of `images` with the backbone's evaluation preprocessing; on the
    backbone's device when `keep_on_device`, else gathered on the CPU chunk by chunk (large sets
    must not pile up in GPU memory)."""
    device, was_training = _device(backbone), backbone.training
    backbone.eval()
    chunks = []
    try:
        for batch, _ in image_loader(images, backbone.eval_transform, batch_size=batch_size,
                                     num_workers=num_workers, device=device):
            with autocast():
                feats = backbone.encode_image(batch.to(device, non_blocking=True)).float()
            chunks.append(feats if keep_on_device else feats.cpu())  # (b, d)
    finally:
        backbone.train(was_training)
    return torch.cat(chunks)  # (N, d)


@torch.no_grad()
def encode_texts(backbone, texts: Sequence[str], *, batch_size: int = 1024,
                 autocast=nullcontext, keep_on_device: bool = False) -> torch.Tensor:
    """(N, d) float32 features of `texts` (tokenized by the backbone), placed as encode_images."""
    device, was_training = _device(backbone), backbone.training
    backbone.eval()
    chunks = []
    try:
        for start in range(0, len(texts), batch_size):
            tokens = backbone.tokenize(list(texts[start:start + batch_size])).to(device)
            with autocast():
                feats = backbone.encode_text(tokens).float()
            chunks.append(feats if keep_on_device else feats.cpu())  # (b, d)
    finally:
        backbone.train(was_training)
    return torch.cat(chunks)  # (N, d)
