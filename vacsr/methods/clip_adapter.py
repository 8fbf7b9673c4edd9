"""CLIP-Adapter (Gao et al., IJCV 2024, arXiv 2110.04544, sec. 3.2, eq. 2-3): a bottleneck MLP
A(f) = ReLU(ReLU(f W1) W2) on the frozen CLIP image feature f, blended with f by a residual ratio
alpha: f' = alpha A(f) + (1 - alpha) f, then CLIP's scoring against the prompt features. The
backbone stays frozen; alpha is searched. At alpha = 0 it is zero-shot CLIP exactly. The adapter
acts on images alone, so classes it never trained on are scored the same way."""
from __future__ import annotations

import torch
from torch import nn

from vacsr.config.domains import Float
from vacsr.methods.cosine import CosineHead, clip_logit_scale, cross_entropy_loss
from vacsr.methods.method import FROZEN_CLIP, SHARED_KEYS, Method


class ResidualAdapterHead(CosineHead):
    def __init__(self, *, logit_scale: float, embed_dim: int, reduction: int,
                 residual_ratio: float) -> None:
        super().__init__(logit_scale=logit_scale)
        hidden = max(1, embed_dim // reduction)
        # no biases, ReLU after both layers: the paper's eq. 2
        self.adapter = nn.Sequential(nn.Linear(embed_dim, hidden, bias=False), nn.ReLU(),
                                     nn.Linear(hidden, embed_dim, bias=False), nn.ReLU())
        self.residual_ratio = residual_ratio

    def image_side(self, image_feats: torch.Tensor) -> torch.Tensor:
        ratio = self.residual_ratio
        return ratio * self.adapter(image_feats) + (1.0 - ratio) * image_feats  # (B, d)


def build_head(adapter, backbone) -> ResidualAdapterHead:
    return ResidualAdapterHead(logit_scale=clip_logit_scale(backbone),
                               embed_dim=backbone.embed_dim, reduction=adapter.reduction,
                               residual_ratio=adapter.residual_ratio)


METHOD = Method(
    name="clip_adapter",
    cites="CLIP-Adapter (Gao et al., IJCV 2024, arXiv 2110.04544), sec. 3.2, eq. 2-3",
    trains="a residual bottleneck MLP on the image features (2 d^2 / reduction), frozen CLIP",
    build_head=build_head,
    loss=cross_entropy_loss,
    kind_keys=SHARED_KEYS,
    space={"adapter.residual_ratio": Float(0.05, 0.8)},
    protocol=FROZEN_CLIP,
    own_keys=("adapter.residual_ratio", "adapter.reduction"),
    tasks=("classification",),
    frozen_image_tower=True,
)
