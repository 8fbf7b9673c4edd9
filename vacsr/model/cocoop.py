"""CoCoOp's head (Zhou et al., "Conditional Prompt Learning for Vision-Language Models", CVPR
2022, arXiv 2203.05557, sec. 3.2): CoOp's M context vectors v_m, each shifted by one token that a
small meta-net h computes from the image,

    pi = h(x),   v_m(x) = v_m + pi,   t_c(x) = {v_1(x), ..., v_M(x), c}
    p(y = c | x) = softmax_c( exp(t) cos(x, g(t_c(x))) )

with h Linear-ReLU-Linear, its hidden width the image feature's divided by 16 (sec. 4), and g the
frozen text tower. The class features therefore differ per image: every image's C prompts go
through the text tower, in training and in evaluation (the cost its paper's batch of 1 reflects).

With h's output zero (`pi` = 0) it is CoOp with the same context exactly
(tests/unit/test_methods.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vacsr.model.adapter import AdapterOutput
from vacsr.model.clip_heads import PromptContextHead, encode_with_context

META_REDUCTION = 16  # the meta-net's hidden width: the image feature's / 16 (sec. 4)
# prompts through the text tower per evaluation chunk: about a CoOp evaluation's batch
PROMPTS_PER_CHUNK = 1024


class ConditionalContextHead(PromptContextHead):
    """exp(t) cos(x, g(t_c(x))): each image's own class features, (B, C, D)."""

    def __init__(self, *, logit_scale: float, context: torch.Tensor, words: str,
                 image_dim: int) -> None:
        super().__init__(logit_scale=logit_scale, context=context, words=words)
        hidden = max(1, image_dim // META_REDUCTION)
        self.meta_net = nn.Sequential(nn.Linear(image_dim, hidden), nn.ReLU(inplace=True),
                                      nn.Linear(hidden, context.shape[1]))

    def encode_conditioned(self, backbone, tokens: torch.Tensor,
                           image_feats: torch.Tensor) -> torch.Tensor:
        """(C, T) prompt ids and (B, d) image features -> (B, C, D) normalised class features,
        every image's C prompts through the frozen text tower with its own context."""
        shift = self.meta_net(F.normalize(image_feats.float(), dim=-1))  # (B, W) pi
        b, c = shift.shape[0], tokens.shape[0]
        context = self.context[None] + shift[:, None]  # (B, M, W)
        # image-major: prompt i * C + k is image i's class k
        flat_context = context[:, None].expand(-1, c, -1, -1).reshape(b * c, *context.shape[1:])
        features = encode_with_context(backbone, tokens.repeat(b, 1), flat_context)
        return features.reshape(b, c, -1)  # (B, C, D)

    def forward(self, image_feats: torch.Tensor, text_feats: torch.Tensor,
                sample: bool | None = None) -> AdapterOutput:
        """image_feats (B, d) with their own class features (B, C, d) -> (B, C) logits; a
        (C, d) class set shared by every image (the plain prompts) scores as CoOp's."""
        if text_feats.dim() == 2:
            return super().forward(image_feats, text_feats)
        image = F.normalize(image_feats, dim=-1)  # (B, d)
        text = F.normalize(text_feats, dim=-1)  # (B, C, d)
        logits = self.logit_scale.exp() * torch.einsum("bd,bcd->bc", image, text)  # (B, C)
        return AdapterOutput(logits=logits, sigma_hat=None)


@torch.no_grad()
def conditioned_logits(head: ConditionalContextHead, backbone, tokens: torch.Tensor,
                       image_feats: torch.Tensor, autocast) -> torch.Tensor:
    """(N, d) image features -> (N, C) logits, images in chunks of about PROMPTS_PER_CHUNK
    prompts; on the features' device."""
    device = next(backbone.parameters()).device
    tokens = tokens.to(device)
    step = max(1, PROMPTS_PER_CHUNK // tokens.shape[0])
    rows = []
    for start in range(0, image_feats.shape[0], step):
        chunk = image_feats[start:start + step].to(device)  # (b, d)
        with autocast():
            text = head.encode_conditioned(backbone, tokens, chunk)  # (b, C, D)
        rows.append(head(chunk.float(), text.float()).logits.to(image_feats.device))
    return torch.cat(rows)  # (N, C)


class ScoreRows(nn.Module):
    """Scores already computed, one row per query and one column per class: items are one-hot
    class rows, so a (queries x items) block is the queries' columns of those classes. What a
    head whose class features depend on the image (CoCoOp) is scored by once its encoding pass
    gave each image's logits."""

    @torch.no_grad()
    def score_block(self, queries: torch.Tensor, items: torch.Tensor):
        return queries @ items.T, None  # (b, C) x (c, C) -> (b, c)
