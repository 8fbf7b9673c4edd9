"""VACSR model: an open_clip backbone feeding a method's head (the variational adapter, the
baseline head, or a compared method's: vacsr/methods/). vacsr/methods/build.py builds it."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vacsr.model.adapter import AdapterOutput
from vacsr.model.backbone import ClipBackbone


class VACSRModel(nn.Module):
    def __init__(self, backbone: ClipBackbone, head: nn.Module, method: Any) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        # the vacsr.methods.Method the head belongs to: what the head needs from a run
        # (class weights, its own prompt encoding) is asked of it, never probed on the head
        self.method = method

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
