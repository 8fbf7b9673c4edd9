"""CLIP-Adapter (Gao et al., IJCV 2024, arXiv 2110.04544, sec. 3.2, eq. 2-3): a bottleneck MLP
A(f) = ReLU(ReLU(f W1) W2) on the frozen CLIP image feature f, blended with f by a residual ratio
alpha: f' = alpha A(f) + (1 - alpha) f, then CLIP's scoring against the prompt features
(vacsr/model/clip_heads.py ResidualAdapterHead). The backbone stays frozen; alpha is searched. At
alpha = 0 it is zero-shot CLIP exactly. The adapter acts on images alone, so classes it never
trained on are scored the same way."""
from __future__ import annotations

from vacsr.config.domains import Float
from vacsr.methods.method import FROZEN_CLIP, SHARED_KEYS, Method, cross_entropy


def build_head(adapter, backbone):
    from vacsr.model.clip_heads import ResidualAdapterHead, clip_logit_scale

    return ResidualAdapterHead(logit_scale=clip_logit_scale(backbone),
                               embed_dim=backbone.embed_dim, reduction=adapter.reduction,
                               residual_ratio=adapter.residual_ratio)


METHOD = Method(
    name="clip_adapter",
    cites="CLIP-Adapter (Gao et al., IJCV 2024, arXiv 2110.04544), sec. 3.2, eq. 2-3",
    trains="a residual bottleneck MLP on the image features (2 d^2 / reduction), frozen CLIP",
    build_head=build_head,
    loss=cross_entropy,
    kind_keys=SHARED_KEYS,
    space={"adapter.residual_ratio": Float(0.05, 0.8)},
    protocol=FROZEN_CLIP,
    own_keys=("adapter.residual_ratio", "adapter.reduction"),
    tasks=("classification",),
    frozen_image_tower=True,
)
