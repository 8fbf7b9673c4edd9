"""The linear probe initialised at the zero-shot prototypes (ZS-LP of CLAP, Silva-Rodriguez et al.,
CVPR 2024, sec. 3.2): one weight vector per training class, trained with cross-entropy on frozen
CLIP image features and started at that class's prompt feature, so before its first step it is
zero-shot CLIP exactly.

Here the weight of class c is w_c = t_c + delta_c with t_c the (frozen) prompt feature and delta_c
trained from 0: the same linear classifier as training w_c directly from t_c, and the head keeps
no copy of the prompts. Classes it never trained on (novel classes, another dataset) have no
weight: they are scored by their zero-shot prototypes (delta = 0).
"""
from __future__ import annotations

import torch
from torch import nn

from vacsr.config.domains import Choice
from vacsr.methods.cosine import CosineHead, clip_logit_scale, cross_entropy_loss
from vacsr.methods.method import FROZEN_CLIP, SHARED_KEYS, Method


class PrototypeHead(CosineHead):
    """exp(t) cos(v, t_c + delta_c); delta (C, d) is sized to the training classes (`fit_classes`)
    and, when a checkpoint is loaded, to the classes it holds."""

    def __init__(self, *, logit_scale: float, embed_dim: int) -> None:
        super().__init__(logit_scale=logit_scale)
        self.delta = nn.Parameter(torch.zeros(0, embed_dim))  # (C, d) once fitted

    def fit_classes(self, count: int) -> None:
        """One zero residual per training class (before the optimizer is built)."""
        self.delta = nn.Parameter(self.delta.new_zeros(count, self.delta.shape[1]))

    def text_side(self, text_feats: torch.Tensor) -> torch.Tensor:
        if text_feats.shape[0] != self.delta.shape[0]:
            raise ValueError(f"linear probe: {text_feats.shape[0]} class features for "
                             f"{self.delta.shape[0]} trained prototypes; classes it did not "
                             "train on are scored by unseen_head")
        return text_feats + self.delta  # (C, d)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        stored = state_dict.get(prefix + "delta")
        if stored is not None and stored.shape != self.delta.shape:  # the checkpoint's classes
            self.fit_classes(stored.shape[0])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def build_head(adapter, backbone) -> PrototypeHead:
    return PrototypeHead(logit_scale=clip_logit_scale(backbone), embed_dim=backbone.embed_dim)


def zero_shot_prototypes(head: PrototypeHead) -> CosineHead:
    """The head for classes it never trained on: their prompt features alone."""
    return CosineHead(logit_scale=float(head.logit_scale)).to(head.logit_scale.device)


METHOD = Method(
    name="linear_probe",
    cites="CLAP (Silva-Rodriguez et al., CVPR 2024), sec. 3.2: ZS-LP, a linear probe initialised "
          "at the zero-shot prototypes",
    trains="one prototype per base class (C x d), on frozen CLIP features",
    build_head=build_head,
    loss=cross_entropy_loss,
    kind_keys=SHARED_KEYS,
    space={"optim.weight_decay": Choice((0.0, 1e-4, 1e-2))},
    protocol=FROZEN_CLIP,
    tasks=("classification",),
    unseen_head=zero_shot_prototypes,
    unseen_rule="their zero-shot prototypes (no trained weight exists for them)",
    frozen_image_tower=True,
)
