"""VACSR losses (paper section 3.2, appendix B) and the sigmoid baseline (Table 6 "w/o all").

Every loss returns (loss, dict of named parts). Labels are a (B, B') {0, 1} matrix y_ij.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vacsr.config import LOSS_NEG_COLUMNS, LOSS_REDUCTIONS
from vacsr.model.adapter import AdapterOutput


def kl_upper_bound(mu: torch.Tensor, logvar: torch.Tensor,
                   mix_weights: torch.Tensor) -> torch.Tensor:
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


def _reduce(recon, sigma_pos, sigma_neg, positives, row_mask, col_mask, reduction: str):
    """Per-pair terms (B, B') -> (L_recon, L_sigma^P, L_sigma^N) scalars.

    The paper (sec. 3.2) does not state its reductions, and they set the weight gamma carries:
    - pair_mean: L_recon a mean over all B x B' pairs, L_sigma^P and L_sigma^N means over their own
      few pairs; gamma = 1 then weighs one positive's L_sigma about B' times its L_recon.
    - per_query: one shared normaliser, every term summed over its pairs and divided by the number
      of queries B (the SigLIP reduction); gamma = 1 weighs a pair's L_sigma like its L_recon.
    - balanced: L_recon = mean over positives + mean over negatives (each class of pair weighs
      the same whatever B'), L_sigma terms means over their own pairs.
    """
    negatives = ~positives
    if reduction == "pair_mean":
        l_recon = recon.mean()
    elif reduction == "balanced":
        l_recon = _masked_mean(recon, positives) + _masked_mean(recon, negatives)
    elif reduction == "per_query":
        rows = recon.shape[0]
        return (recon.sum() / rows, (sigma_pos * positives).sum() / rows,
                ((sigma_neg * row_mask).sum() + (sigma_neg * col_mask).sum()) / rows)
    else:
        raise ValueError(f"reduction: expected one of {', '.join(LOSS_REDUCTIONS)}, "
                         f"got {reduction!r}")
    l_pos = _masked_mean(sigma_pos, positives)
    # Both directions: a pair hardest for its row and for its column counts twice.
    num_neg = row_mask.sum() + col_mask.sum()
    l_neg = ((sigma_neg * row_mask).sum() + (sigma_neg * col_mask).sum()) / num_neg.clamp(min=1)
    return l_recon, l_pos, l_neg


def vacsr_loss(output: AdapterOutput, labels: torch.Tensor, *, alpha_kl: float = 0.0005,
               beta: float = 1.0, gamma: float = 1.0, num_hard_negatives: int = 1,
               straight_through: bool = True, neg_sigma_target: str = "label",
               use_kl: bool = True, use_sigma_loss: bool = True, reduction: str = "per_query",
               neg_columns: str = "all"):
    """L = alpha L_KL + beta (L_recon + gamma (L_sigma^P + L_sigma^N))  (paper sec. 3.2, eq. for L).

    output: the adapter's (B, B') block; labels (B, B') in {0, 1}. L_sigma^N covers the
    `num_hard_negatives` highest-scoring negatives of every row (query) and every column; with
    neg_columns="with_positive" only columns that have a positive in the block (classification:
    classes present in the batch) contribute column terms. neg_sigma_target: the target of the
    negatives' L_sigma, "label" (y = 0) or "positive" (1, the literal reading of appendix E.1).
    """
    labels = labels.to(output.logits.dtype)
    positives = labels.bool()
    prob = match_probability(output.logits, straight_through)  # (B, B')
    kl = kl_upper_bound(output.mu, output.logvar, output.mix_weights).mean()
    row_mask, col_mask = hard_negative_masks(output.logits, labels, num_hard_negatives)
    if neg_columns == "with_positive":
        col_mask = col_mask & positives.any(dim=0, keepdim=True)
    elif neg_columns != "all":
        raise ValueError(f"neg_columns: expected one of {', '.join(LOSS_NEG_COLUMNS)}, "
                         f"got {neg_columns!r}")
    neg_target = labels if neg_sigma_target == "label" else torch.ones_like(labels)
    recon, sigma_pos, sigma_neg = _reduce(
        0.5 * (labels - prob).pow(2), sigma_loss(labels, prob, output.sigma_hat),
        sigma_loss(neg_target, prob, output.sigma_hat), positives, row_mask, col_mask, reduction)
    inner = recon + (gamma * (sigma_pos + sigma_neg) if use_sigma_loss else 0.0)
    loss = beta * inner + (alpha_kl * kl if use_kl else 0.0)
    sigma_hat = output.sigma_hat.detach()
    parts = {"loss": loss.detach(), "kl": kl.detach(), "recon": recon.detach(),
             "sigma_pos": sigma_pos.detach(), "sigma_neg": sigma_neg.detach(),
             "sigma_hat_pos": _masked_mean(sigma_hat, positives),
             "sigma_hat_neg": _masked_mean(sigma_hat, ~positives),
             "sigma_hat_hard_neg": _masked_mean(sigma_hat, row_mask | col_mask)}
    return loss, parts


def sigmoid_loss(logits: torch.Tensor, labels: torch.Tensor):
    """SigLIP loss (Zhai et al. 2023) over all pairs: -log sigmoid(z_ij * logit_ij), z = 2y - 1,
    summed over columns and averaged over rows as SigLIP does."""
    signs = 2.0 * labels.to(logits.dtype) - 1.0
    loss = -F.logsigmoid(signs * logits).sum(dim=1).mean()
    return loss, {"loss": loss.detach(), "sigmoid": loss.detach()}
