"""MaPLe (Khattak et al., "MaPLe: Multi-modal Prompt Learning", CVPR 2023, arXiv 2210.03117, sec.
3.2-3.3): learned language prompts in the first J blocks of the text tower, and vision prompts
coupled to them by a linear function per block in the first J blocks of the image tower
(vacsr/model/maple.py). CLIP stays frozen; the prompts and the couplings train with
cross-entropy on CLIP's scoring. Classes never trained on are scored by their names after the
same prompts, as CoOp's.

Its ViT-B/16 setting (sec. 4.1): prompt depth J = 9 of 12 (`adapter.maple_depth` -1 takes that
share of any tower's depth; N: the first N blocks), M = 2 context tokens started at "a photo of
a", SGD at lr 0.0035, batch 4, 5 base-to-novel epochs. Searched here as CoOp is: the init (and M
under a random one) beside the budget every compared method shares. The images go through the
prompted image tower every step, so they keep the sweep's augmentation and nothing of either
tower is computed once.
"""
from __future__ import annotations

from vacsr.methods import coop
from vacsr.methods.method import (
    FROZEN_TOWERS,
    SHARED_KEYS,
    Method,
    cross_entropy,
    share_of_depth,
)
from vacsr.model.prompt_room import COUNT_KEY, INIT_KEY

PAPER_SHARE = (9, 12)  # the paper's prompted blocks per tower depth: J = 9 of ViT-B/16's 12
DEPTH_KEY = "adapter.maple_depth"


def prompt_depth(setting: int, depth: int, model: str = "the model") -> int:
    """J: `adapter.maple_depth`, or with -1 the paper's share of a `depth`-block tower."""
    return share_of_depth(setting, depth, PAPER_SHARE, DEPTH_KEY, model)


def build_head(adapter, backbone):
    from vacsr.model.clip_heads import clip_logit_scale, context_words, initial_context
    from vacsr.model.maple import MultiModalPromptHead
    from vacsr.model.prefix import blocks

    visual = backbone.clip.visual
    depth = min(len(blocks(backbone.clip, tower)) for tower in ("image", "text"))
    return MultiModalPromptHead(
        logit_scale=clip_logit_scale(backbone), context=initial_context(adapter, backbone),
        words=context_words(adapter),
        depth=prompt_depth(adapter.maple_depth, depth, backbone.name),
        image_width=blocks(backbone.clip, "image")[0].ln_1.normalized_shape[0],
        ln_pre=getattr(visual, "ln_pre", None))


def hooked_blocks(values, depth: int) -> int:
    """Every block: the vision prompts enter at block 0 (the language prompts' backward reaches
    the text tower's input through CoOp's context anyway)."""
    prompt_depth(int(values[DEPTH_KEY]), depth, values["model.name"])
    return depth


METHOD = Method(
    name="maple",
    cites="MaPLe (Khattak et al., CVPR 2023, arXiv 2210.03117), sec. 3.2-3.3: deep language "
          "prompts and vision prompts coupled to them",
    trains="language prompts in the first J text blocks and their coupling functions to vision "
           "prompts in the first J image blocks, frozen CLIP",
    build_head=build_head,
    loss=cross_entropy,
    kind_keys=SHARED_KEYS,
    space=coop.context_space(counts=(2, 4)),  # its paper's M = 2
    protocol=FROZEN_TOWERS,
    own_keys=(COUNT_KEY, INIT_KEY, DEPTH_KEY),
    tasks=("classification",),
    unseen_rule="their own names after the same prompts, through the same prompted towers",
    prompts=coop.prompts,
    encodes_prompts=True,
    hooked_blocks=hooked_blocks,
    learned_context=True,
)
