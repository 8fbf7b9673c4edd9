"""CLIP's own scoring, shared by the methods that keep it: logits = exp(t) cos(v, w) with CLIP's
learned temperature t (Radford et al., 2021, sec. 2.3), frozen at the backbone's value."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vacsr.model.adapter import AdapterOutput


def clip_logit_scale(backbone) -> float:
    """log of CLIP's temperature scale (log 100 for OpenAI's weights)."""
    return float(backbone.clip.logit_scale.detach().float())


class CosineHead(nn.Module):
    """exp(t) cos(image, text) over a (B, B') block; subclasses change the image features
    (`image_side`) or the class features (`text_side`). No sigma_hat."""

    def __init__(self, *, logit_scale: float) -> None:
        super().__init__()
        # a buffer: saved with the checkpoint, never trained
        self.register_buffer("logit_scale", torch.tensor(float(logit_scale)))

    def image_side(self, image_feats: torch.Tensor) -> torch.Tensor:
        return image_feats

    def text_side(self, text_feats: torch.Tensor) -> torch.Tensor:
        return text_feats

    def forward(self, image_feats: torch.Tensor, text_feats: torch.Tensor,
                sample: bool | None = None) -> AdapterOutput:
        image = F.normalize(self.image_side(image_feats), dim=-1)  # (B, d)
        text = F.normalize(self.text_side(text_feats), dim=-1)  # (B', d)
        return AdapterOutput(logits=self.logit_scale.exp() * image @ text.T, sigma_hat=None)

    @torch.no_grad()
    def score_block(self, queries: torch.Tensor, items: torch.Tensor):
        return self.forward(queries, items).logits, None


def cross_entropy_loss(head: nn.Module, image_feats: torch.Tensor, text_feats: torch.Tensor,
                       labels: torch.Tensor, loss_config) -> tuple[torch.Tensor, dict]:
    """Cross-entropy of each image's class logits (CoOp eq. 2, CLIP-Adapter sec. 3.2, CLAP's
    linear probe): `labels` (B, C) one-hot rows of y_ij."""
    logits = head(image_feats, text_feats).logits  # (B, C)
    loss = F.cross_entropy(logits, labels.argmax(dim=1))
    return loss, {"ce": loss.detach()}
