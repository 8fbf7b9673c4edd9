"""One frozen prefix per tower (vacsr/model/frozen.py): the backbone, the evaluation passes' cache,
the memory estimate and the sweep's cost estimate all see the same depth for every side, block
count and pooling, and the split forward (prefix, then suffix) is open_clip's forward."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from vacsr.model import prefix
from vacsr.model.backbone import ClipBackbone
from vacsr.model.encoding import encode_images, encode_texts
from vacsr.model.frozen import frozen_blocks
from vacsr.model.memory import estimate_step_memory, towers
from vacsr.model.prefix_cache import PrefixCache, image_inputs_digest
from vacsr.sweep.cost import estimate
from vacsr.sweep.cost.calibrate import StepCosts
from vacsr.sweep.cost.counts import DatasetCounts

DEPTH = 3  # blocks of each tower of vacsr-tiny
# (side, trainable blocks) -> the frozen prefix's blocks, written out: the rule's table
EXPECTED = {("first", 0): 3, ("first", 1): 0, ("first", -1): 0,
            ("last", 0): 3, ("last", 1): 2, ("last", -1): 0}
TOWERS = ("image", "text")


def _leading_frozen(backbone, tower: str) -> int:
    """Blocks below the first one with a trainable parameter (what actually trains)."""
    for index, block in enumerate(prefix.blocks(backbone.clip, tower)):
        if any(p.requires_grad for p in block.parameters()):
            return index
    return DEPTH


def _cache_depth(backbone, tower: str, cache: PrefixCache, inputs: str) -> int:
    """The depth whose file the cache holds for `inputs` (-1: none, or several)."""
    found = [d for d in range(DEPTH + 1)
             if cache.path(tower, cache.key(backbone, tower, d, inputs, "float32",
                                            torch.device("cpu"))).is_file()]
    return found[0] if len(found) == 1 else -1


def _memory_depths(side: str, blocks: int, use_gpo: bool) -> tuple[int, int]:
    """The frozen blocks the memory estimate counts per tower: L minus the blocks whose bf16
    weight copies it keeps for the backward pass (the other tower held fully frozen)."""
    image, text, _ = towers("vacsr-tiny")
    depths = []
    for tower, counts in ((image, (blocks, 0)), (text, (0, blocks))):
        casts = estimate_step_memory("vacsr-tiny", batch_size=2, dtype="bf16", side=side,
                                     image_blocks=counts[0], text_blocks=counts[1],
                                     use_gpo=use_gpo)["casts"]
        depths.append(DEPTH - casts // (2 * tower.block_params()))
    return depths[0], depths[1]


def _cost_depths(side: str, blocks: int) -> tuple[int, int]:
    """The frozen blocks the cost estimate credits: the image tower's from a cached val pass
    (only the blocks above the prefix run), the text tower's from the prompts' per-step pass
    (the prefix runs once per run); both also from the backward path."""
    shape = estimate.RunSettings(batch_size=1, side=side, image_blocks=blocks,
                                 text_blocks=blocks)
    unit = dict(device="cpu", memory_gib=None, image_forward=0.0, image_backward_block=0.0,
                text_forward=0.0, text_backward_block=0.0, head_pair=0.0, image_load=0.0,
                startup=0.0)
    val_pass = estimate.epoch_seconds(
        shape, StepCosts(**unit | {"image_forward": 1.0}),
        DatasetCounts(train=0, val=1, test=0, prompts=0), (DEPTH, DEPTH), cached=True)
    prompts = estimate.step_seconds(shape, StepCosts(**unit | {"text_forward": 1.0}), 1,
                                    (DEPTH, DEPTH))
    image, text = round(DEPTH * (1 - val_pass)), round(DEPTH * (1 - prompts))
    for depth, count in ((image, blocks), (text, blocks)):
        assert estimate.path_blocks(count, DEPTH, side) == DEPTH - depth
    return image, text


def _images(folder, count=3) -> list[str]:
    rng = np.random.default_rng(0)
    paths = []
    for index in range(count):
        path = folder / f"{index}.png"
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


def _open_clip_reference(backbone, images, tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """The features from open_clip's own forward: encode_image / encode_text, or with GPO its
    tokens (forward_intermediates; the text Transformer's forward) pooled by the backbone's GPO."""
    clip = backbone.clip
    if not backbone.use_gpo:
        return clip.encode_image(images, normalize=True), clip.encode_text(tokens, normalize=True)
    image_tokens = backbone.image_tokens(images)  # (B, 1+N, D)
    lengths = torch.full((image_tokens.shape[0],), image_tokens.shape[1])
    image = F.normalize(backbone.image_gpo(image_tokens, lengths), dim=-1)
    x = clip.token_embedding(tokens) + clip.positional_embedding  # (B, T, W)
    x = clip.ln_final(clip.transformer(x, attn_mask=clip.attn_mask)) @ clip.text_projection
    text = F.normalize(backbone.text_gpo(x, tokens.argmax(dim=-1) + 1), dim=-1)
    return image, text


@pytest.mark.parametrize("use_gpo", [True, False])
@pytest.mark.parametrize("side,blocks", list(EXPECTED))
def test_every_reader_sees_one_frozen_depth_and_the_split_is_open_clips_forward(
        tmp_path, side, blocks, use_gpo):
    torch.manual_seed(0)
    backbone = ClipBackbone(use_gpo=use_gpo, trainable_image_blocks=blocks,
                            trainable_text_blocks=blocks, trainable_side=side).eval()
    expected = EXPECTED[side, blocks]
    for tower in TOWERS:
        assert backbone.frozen_depth(tower) == _leading_frozen(backbone, tower) == expected
        assert frozen_blocks(side, blocks, DEPTH) == expected  # the rule the estimates read

    paths, texts = _images(tmp_path), ["a photo of a cat.", "dog", "a b c d e f g"]
    cache = PrefixCache(tmp_path / "cache")
    encoded = (encode_images(backbone, paths, batch_size=2, cache=cache),
               encode_texts(backbone, texts, batch_size=2, cache=cache))
    tokens = backbone.tokenize(texts)
    inputs = {"image": image_inputs_digest(paths),
              "text": hashlib.sha256(tokens.numpy().tobytes()).hexdigest()}
    cached = {t: _cache_depth(backbone, t, cache, inputs[t]) for t in TOWERS}
    # depth 0 is no prefix: nothing is cached (the stem's output alone would save nothing)
    assert cached == {t: expected if expected else -1 for t in TOWERS}
    assert cache.stats.stored == (len(paths) + len(texts) if expected else 0)
    assert _memory_depths(side, blocks, use_gpo) == (expected, expected)
    assert _cost_depths(side, blocks) == (expected, expected)

    images = torch.stack([backbone.eval_transform(Image.open(p)) for p in paths])
    with torch.no_grad():
        image_ref, text_ref = _open_clip_reference(backbone, images, tokens)
        split_image = prefix.image_suffix(backbone, prefix.image_prefix(backbone, images,
                                                                        expected), expected)
        split_text = prefix.text_suffix(backbone, prefix.text_prefix(backbone, tokens, expected),
                                        tokens, expected)
        for split, forward, reference in ((split_image, backbone.encode_image(images), image_ref),
                                          (split_text, backbone.encode_text(tokens), text_ref)):
            torch.testing.assert_close(split, reference, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(forward, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(encoded[0], image_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(encoded[1], text_ref, rtol=1e-5, atol=1e-5)


def test_the_cache_key_digests_what_the_prefix_reads():
    """prefix_tensors names the stem and the first `depth` blocks, the attention mask included;
    a change to a block above the prefix keeps the key, one inside it changes it."""
    from vacsr.model.prefix_cache import prefix_weights_digest

    backbone = ClipBackbone(use_gpo=False, trainable_text_blocks=1, trainable_side="last")
    names = [name for name, _ in prefix.prefix_tensors(backbone, "text", 2)]
    assert any(n.startswith("block.1.") for n in names)
    assert not any(n.startswith("block.2.") for n in names)
    assert any(value is backbone.clip.attn_mask
               for _, value in prefix.prefix_tensors(backbone, "text", 2))
    before = prefix_weights_digest(backbone, "text", 2)
    with torch.no_grad():
        prefix.blocks(backbone.clip, "text")[2].ln_1.weight.add_(1.0)
    assert prefix_weights_digest(backbone, "text", 2) == before
    with torch.no_grad():
        prefix.blocks(backbone.clip, "text")[1].ln_1.weight.add_(1.0)
    assert prefix_weights_digest(backbone, "text", 2) != before
