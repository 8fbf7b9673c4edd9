"""Zero-shot CLIP (Radford et al., ICML 2021, sec. 3.1.4): each class's prompt feature against the
image features, nothing trained and nothing searched. A sweep evaluates it once per dataset: no
seed changes it (the few-shot sample is never read)."""
from __future__ import annotations

from vacsr.methods.method import FROZEN_CLIP, Method


def build_head(adapter, backbone):
    from vacsr.model.clip_heads import CosineHead, clip_logit_scale

    return CosineHead(logit_scale=clip_logit_scale(backbone))


METHOD = Method(
    name="zero_shot",
    cites="CLIP (Radford et al., ICML 2021), sec. 3.1.4: prompt features as the classifier",
    trains="nothing (one evaluation per dataset)",
    build_head=build_head,
    loss=None,
    kind_keys=(),
    protocol={**FROZEN_CLIP, "train.epochs": 1},  # its one epoch is its evaluation
    ignores=("train.epochs",),
    tasks=("classification",),
    unseen_rule="the prompts of those classes, as every class",
    frozen_image_tower=True,
)
