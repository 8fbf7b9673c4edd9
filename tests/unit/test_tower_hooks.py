"""The towers' hooks for deep methods (vacsr/model/tower_hooks.py): with none, or with hooks that
change nothing, each tower is open_clip's own forward; a hook changes only the blocks above it,
its parameters alone learn, the frozen prefix ends at it and the prefix cache keeps serving the
blocks below; a text hook that inserts tokens is refused."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from vacsr.model.backbone import ClipBackbone
from vacsr.model.encoding import encode_texts
from vacsr.model.frozen import frozen_blocks, gradient_blocks
from vacsr.model.prefix import image_prefix, prefix_tensors
from vacsr.model.prefix_cache import PrefixCache
from vacsr.model.tower_hooks import TowerHooks

PROMPTS = ["a photo of a cat.", "a photo of a dog.", "a photo of a tiny red car."]


def _backbone(trainable: int) -> ClipBackbone:
    torch.manual_seed(0)
    return ClipBackbone(use_gpo=False, train_projections=False, trainable_image_blocks=trainable,
                        trainable_text_blocks=trainable, trainable_side="last").eval()


def _inputs(backbone):
    torch.manual_seed(1)
    size = backbone.clip.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    return torch.randn(2, 3, size, size), backbone.tokenize(PROMPTS)  # (2, 3, S, S), (3, T)


@torch.no_grad()
def _open_clip(backbone, images, tokens):
    return (backbone.clip.encode_image(images, normalize=True),
            backbone.clip.encode_text(tokens, normalize=True))


@pytest.mark.parametrize("trainable", [0, -1])  # the whole tower frozen (a prefix), or training
def test_hooks_that_change_nothing_leave_each_tower_open_clips(trainable):
    backbone = _backbone(trainable)
    images, tokens = _inputs(backbone)
    reference = _open_clip(backbone, images, tokens)
    same = TowerHooks(before={0: lambda x: x}, after={1: lambda x: x + 0.0})
    backbone.attach_hooks({"image": same, "text": same})
    with torch.no_grad():
        hooked = backbone.encode_image(images), backbone.encode_text(tokens)
    for ours, theirs in zip(hooked, reference):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert backbone.frozen_depth("image") == 0  # capped at the first hooked block
    backbone.attach_hooks({})  # detached: the rule's own prefix again
    assert backbone.frozen_depth("image") == (3 if trainable == 0 else 0)


def test_a_hook_changes_the_blocks_above_it_alone_and_its_parameters_alone_learn(tmp_path):
    backbone = _backbone(0)  # a frozen CLIP: the whole tower was its prefix
    images, tokens = _inputs(backbone)
    reference = _open_clip(backbone, images, tokens)
    below = image_prefix(backbone, images, 1).detach()
    weights = dict(prefix_tensors(backbone, "image", 1))
    # not the same in every channel: the LayerNorms would take a uniform shift out
    shift = {tower: nn.Parameter(torch.linspace(-0.5, 0.5, width)) for tower, width in
             (("image", backbone.clip.visual.transformer.width),
              ("text", backbone.clip.transformer.width))}
    backbone.attach_hooks({tower: TowerHooks(after={1: lambda x, s=shift[tower]: x + s})
                           for tower in shift})
    assert backbone.frozen_depth("image") == backbone.frozen_depth("text") == 1
    image, text = backbone.encode_image(images), backbone.encode_text(tokens)
    assert not torch.allclose(image, reference[0]) and not torch.allclose(text, reference[1])
    (image.sum() + text.sum()).backward()
    assert all(s.grad is not None and s.grad.abs().sum() > 0 for s in shift.values())
    assert all(p.grad is None for p in backbone.parameters())  # the backbone stays frozen
    # the blocks below the hook compute what they did: the prefix, its weights, its cache key
    torch.testing.assert_close(image_prefix(backbone, images, 1), below)
    assert dict(prefix_tensors(backbone, "image", 1)).keys() == weights.keys()
    cache = PrefixCache(tmp_path / "cache")
    with torch.no_grad():
        direct = backbone.encode_text(tokens)
        first = encode_texts(backbone, PROMPTS, cache=cache)
        again = encode_texts(backbone, PROMPTS, cache=cache)
    assert cache.stats.served == len(PROMPTS)  # the second pass read block 0's output back
    torch.testing.assert_close(first, direct, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(again, first)


def test_a_text_hook_that_inserts_tokens_is_refused_and_a_block_outside_the_tower_too():
    backbone = _backbone(-1)
    _, tokens = _inputs(backbone)
    backbone.attach_hooks({"text": TowerHooks(before={1: lambda x: torch.cat([x, x[:, :1]], 1)})})
    with pytest.raises(ValueError, match="text hooks replace tokens, never insert"):
        backbone.encode_text(tokens)
    with pytest.raises(ValueError, match=r"image tower hooks at block\(s\) \[3\]: the tower has "
                                         r"blocks 0-2"):
        backbone.attach_hooks({"image": TowerHooks(after={3: lambda x: x})})


def test_the_prefix_rule_ends_at_the_first_hooked_block():
    # a frozen ViT-B/16 tower of 12 blocks with MMA's adapters on blocks 5-11
    assert frozen_blocks("first", 0, 12, first_hook=5) == 5
    assert gradient_blocks("first", 0, 12, first_hook=5) == 7
    assert frozen_blocks("last", 2, 12, first_hook=5) == 5  # the lower of the two
    assert frozen_blocks("last", 2, 12, first_hook=11) == 10
    assert frozen_blocks("first", 0, 12) == 12 and frozen_blocks("first", -1, 12,
                                                                 first_hook=5) == 0
