"""VACSR losses (paper section 3.2, appendix B; DESIGN.md section 2.5) and the sigmoid baseline.

Every loss returns (loss, dict of named parts). Labels are a (B, B') {0, 1} matrix y_ij.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vacsr.model.adapter import AdapterOutput


def kl_upper_bound(mu: torch.Tensor, logvar: torch.Tensor, mix_weights: torch.Tensor) -> torch.Tensor:
    """sum_k alpha_k KL(N(mu_k, var_k) || N(0, I)) per pair (appendix B.2 bound).

    mu, logvar (..., K, L), mix_weights (..., K) -> (...).
    """
    per_component = 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar).sum(dim=-1)  # (..., K)
    return (mix_weights * per_component).sum(dim=-1)


def match_probability(logits: torch.Tensor, straight_through: bool) -> torch.Tensor:
    """p = sigmoid(m). With straight-through (appendix B.1) the backward pass treats dp/dm = 1,
    so d(1/2 (y - p)^2)/dm = -(y - p) and saturated pairs keep their gradient."""
    prob = torch.sigmoid(logits)
    if not straight_through:
        return prob
    return logits + (prob - logits).detach()


def sigma_loss(target: torch.Tensor, prob: torch.Tensor, sigma_hat: torch.Tensor) -> torch.Tensor:
    """Eq. L_sigma per pair: (target - p)^2 / (2 sigma_hat) + log sigma_hat.

    Its minimum over sigma_hat is at sigma_hat = (target - p)^2 / 2."""
    return (target - prob).pow(2) / (2.0 * sigma_hat) + torch.log(sigma_hat)


@torch.no_grad()
def hard_negative_masks(scores: torch.Tensor, labels: torch.Tensor, num: int):
    """The `num` highest-scoring negatives of each row and of each column.

    scores, labels (B, B') -> (row_mask, col_mask), bool (B, B'). Rows or columns with fewer
    negatives than `num` select all they have. Selection carries no gradient.
    """
    neg_scores = scores.detach().float().masked_fill(labels.bool(), float("-inf"))
    row_mask = _top_mask(neg_scores, num, dim=1)
    col_mask = _top_mask(neg_scores, num, dim=0)
    return row_mask, col_mask


def _top_mask(neg_scores: torch.Tensor, num: int, dim: int) -> torch.Tensor:
    k = min(num, neg_scores.shape[dim])
    top = neg_scores.topk(k, dim=dim).indices
    mask = torch.zeros_like(neg_scores, dtype=torch.bool).scatter_(dim, top, True)
    return mask & torch.isfinite(neg_scores)  # drop positives picked when negatives ran out


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    count = mask.sum()
    if count == 0:
        return values.sum() * 0.0  # keeps the graph, contributes nothing
    return (values * mask).sum() / count


def vacsr_loss(output: AdapterOutput, labels: torch.Tensor, *, alpha_kl: float = 0.0005,
               beta: float = 1.0, gamma: float = 1.0, num_hard_negatives: int = 1,
               straight_through: bool = True, neg_sigma_target: str = "label",
               use_kl: bool = True, use_sigma_loss: bool = True):
    """L = alpha L_KL + beta (L_recon + gamma (L_sigma^P + L_sigma^N))  (paper eq. for L, sec. 3.2).

    output: the adapter's (B, B') block; labels (B, B') in {0, 1}.
    """
    labels = labels.to(output.logits.dtype)
    positives = labels.bool()
    prob = match_probability(output.logits, straight_through)  # (B, B')
    recon = 0.5 * (labels - prob).pow(2).mean()  # L_recon over all pairs
    kl = kl_upper_bound(output.mu, output.logvar, output.mix_weights).mean()

    row_mask, col_mask = hard_negative_masks(output.logits, labels, num_hard_negatives)
    neg_target = labels if neg_sigma_target == "label" else torch.ones_like(labels)
    sigma_pos = _masked_mean(sigma_loss(labels, prob, output.sigma_hat), positives)
    neg_values = sigma_loss(neg_target, prob, output.sigma_hat)
    # Both directions: a pair hardest for its row and for its column counts twice.
    sigma_neg = (neg_values * row_mask).sum() + (neg_values * col_mask).sum()
    num_neg = row_mask.sum() + col_mask.sum()
    sigma_neg = sigma_neg / num_neg if num_neg > 0 else neg_values.sum() * 0.0

    inner = recon + (gamma * (sigma_pos + sigma_neg) if use_sigma_loss else 0.0)
    loss = beta * inner + (alpha_kl * kl if use_kl else 0.0)
    parts = {"loss": loss.detach(), "kl": kl.detach(), "recon": recon.detach(),
             "sigma_pos": sigma_pos.detach(), "sigma_neg": sigma_neg.detach(),
             "sigma_hat_pos": _masked_mean(output.sigma_hat.detach(), positives),
             "sigma_hat_neg": _masked_mean(output.sigma_hat.detach(), ~positives)}
    return loss, parts


def sigmoid_loss(logits: torch.Tensor, labels: torch.Tensor):
    """SigLIP loss (Zhai et al. 2023) over all pairs: -log sigmoid(z_ij * logit_ij), z = 2y - 1,
    summed over columns and averaged over rows as SigLIP does."""
    signs = 2.0 * labels.to(logits.dtype) - 1.0
    loss = -F.logsigmoid(signs * logits).sum(dim=1).mean()
    return loss, {"loss": loss.detach(), "sigmoid": loss.detach()}
