"""Zero-shot CLIP (Radford et al., ICML 2021): nothing trained and nothing searched, CLIP's frozen
features scored by exp(t) cos with its own temperature. Classification (sec. 3.1.4): each class's
prompt feature against the image features; image-caption retrieval (appendix E.1, Table 13):
every caption's feature against every image's. A sweep evaluates it once per dataset: no seed
changes it (it trains on neither the few-shot sample nor the training pairs, noisy or not)."""
from __future__ import annotations

from vacsr.methods.method import FROZEN_CLIP, Method


def build_head(adapter, backbone):
    from vacsr.model.clip_heads import CosineHead, clip_logit_scale

    return CosineHead(logit_scale=clip_logit_scale(backbone))


METHOD = Method(
    name="zero_shot",
    cites="CLIP (Radford et al., ICML 2021), sec. 3.1.4: prompt features as the classifier; "
          "appendix E.1: zero-shot image-text retrieval",
    trains="nothing (one evaluation per dataset)",
    build_head=build_head,
    loss=None,
    kind_keys=(),
    protocol={**FROZEN_CLIP, "train.epochs": 1},  # its one epoch is its evaluation
    ignores=("train.epochs",),
    tasks=("classification", "retrieval"),
    unseen_rule="the prompts of those classes, as every class",
    frozen_image_tower=True,
)
