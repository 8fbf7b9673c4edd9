"""VACSR model: an open_clip backbone feeding the variational adapter (or the baseline head)."""
from __future__ import annotations

import torch
from torch import nn

from vacsr.model.adapter import AdapterOutput, head_from_config
from vacsr.model.backbone import ClipBackbone, build_backbone


class VACSRModel(nn.Module):
    def __init__(self, backbone: ClipBackbone, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone.encode_image(images)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.backbone.encode_text(tokens)

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> AdapterOutput:
        """All (image, text) pairs of a batch: (B, 3, H, W) x (B', T) -> (B, B') output."""
        return self.head(self.encode_image(images), self.encode_text(tokens))

    def score(self, image_feats: torch.Tensor, text_feats: torch.Tensor):
        """(N_i, d) x (N_t, d) -> (logits, sigma_hat or None), each (N_i, N_t); no noise."""
        return self.head.score_block(image_feats, text_feats)


def build_model(config) -> VACSRModel:
    """Config -> VACSRModel (backbone from config.model, head from config.adapter)."""
    backbone = build_backbone(config.model)
    head = head_from_config(config.adapter, backbone.embed_dim)
    return VACSRModel(backbone, head)
