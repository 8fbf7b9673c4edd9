"""MMA (Yang et al., "MMA: Multi-Modal Adapter for Vision-Language Models", CVPR 2024, sec. 3):
adapters on the higher blocks of both CLIP towers, each tower's down-projection and up-projection
around a projection the two towers share, added to the blocks' output tokens with a scale alpha
(vacsr/model/mma.py). CLIP stays frozen; its higher blocks carry the dataset-specific knowledge
the adapters tune, its lower blocks the general one they leave alone (the paper's analysis, sec.
3.2), so those stay a frozen prefix the cache serves. At alpha = 0 it is zero-shot CLIP exactly.

Its ViT-B/16 setting (the paper's code release): the adapters on blocks 5-11 of 12 in both towers
(`adapter.mma_blocks` -1, the paper's share: the highest 7 of every 12 blocks; N: the highest N),
a shared width of 32, alpha = 0.001, 5 epochs, batch 16.
Searched here around it: alpha and the shared width, beside the budget every compared method
shares. The class prompts are the dataset's template, as zero-shot CLIP's; the images keep the
sweep's augmentation (the image tower runs every step, so nothing is computed once).
"""
from __future__ import annotations

from vacsr.config.domains import Choice
from vacsr.methods.method import (
    FROZEN_TOWERS,
    SHARED_KEYS,
    Method,
    cross_entropy,
    share_of_depth,
)

PAPER_SHARE = (7, 12)  # the paper's adapted blocks per tower depth: 5-11 of ViT-B/16's 12


def adapted_count(setting: int, depth: int, model: str = "the model") -> int:
    """How many of a `depth`-block tower's highest blocks get an adapter: `adapter.mma_blocks`,
    or with -1 the paper's share of the depth."""
    return share_of_depth(setting, depth, PAPER_SHARE, "adapter.mma_blocks", model)


def adapted_blocks(setting: int, depth: int, model: str = "the model") -> tuple[int, ...]:
    """The adapted blocks of a `depth`-block tower, highest last."""
    return tuple(range(depth - adapted_count(setting, depth, model), depth))


def build_head(adapter, backbone):
    from vacsr.model.clip_heads import clip_logit_scale
    from vacsr.model.mma import MultiModalAdapterHead
    from vacsr.model.prefix import blocks

    clip = backbone.clip
    towers = {tower: blocks(clip, tower) for tower in ("image", "text")}
    return MultiModalAdapterHead(
        logit_scale=clip_logit_scale(backbone),
        widths={tower: found[0].ln_1.normalized_shape[0] for tower, found in towers.items()},
        blocks={tower: adapted_blocks(adapter.mma_blocks, len(found), backbone.name)
                for tower, found in towers.items()},
        dim=adapter.mma_dim, scale=adapter.mma_scale)


def hooked_blocks(values, depth: int) -> int:
    return adapted_count(int(values["adapter.mma_blocks"]), depth, values["model.name"])


METHOD = Method(
    name="mma",
    cites="MMA (Yang et al., CVPR 2024), sec. 3: multi-modal adapters on the higher blocks of "
          "both towers, meeting in a shared projection",
    trains="adapters on the highest blocks of both towers (down, shared, up projections), "
           "frozen CLIP",
    build_head=build_head,
    loss=cross_entropy,
    kind_keys=SHARED_KEYS,
    space={"adapter.mma_scale": Choice((0.0001, 0.001, 0.01)),
           "adapter.mma_dim": Choice((16, 32, 64))},
    protocol=FROZEN_TOWERS,
    own_keys=("adapter.mma_blocks", "adapter.mma_dim", "adapter.mma_scale"),
    tasks=("classification",),
    unseen_rule="the same adapters: they act on every image and every prompt alike",
    hooked_blocks=hooked_blocks,
)
