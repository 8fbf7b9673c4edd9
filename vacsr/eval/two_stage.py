"""Two-stage scoring (an option of the chunked scorer, paper appendix D): cosine similarity picks
the top-k' candidates of every query and of every item; the adapter scores only the union of those
candidate pairs, and each row's top-k is taken among all scored pairs that involve it. Cost:
N_q N_g cosine dot products plus about (N_q + N_g) k' adapter pairs instead of N_q N_g.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from vacsr.eval.metrics import INVALID_KEY, decode_keys, score_keys
from vacsr.eval.scorer import ChunkedScorer, ScoreResult, TopK


class CosineHead(nn.Module):
    """First-stage head: the dot product of L2-normalised features, no sigma_hat."""

    @torch.no_grad()
    def score_block(self, queries: torch.Tensor, items: torch.Tensor):
        return queries @ items.T, None


def cosine_candidates(queries: torch.Tensor, items: torch.Tensor, k_prime: int, *, device=None,
                      memory_budget_bytes: int = 256 * 2**20, query_groups=None,
                      item_groups=None) -> ScoreResult:
    """Top-k' by cosine in both directions (and within groups when given), chunked like the
    adapter."""
    scorer = ChunkedScorer(CosineHead(), device=device, precision="fp32",
                           memory_budget_bytes=memory_budget_bytes,
                           # a cheap head: big blocks
                           target_block_pairs=2**20, max_item_chunk=8192)
    return scorer.score(queries, items, k=k_prime, k_items=k_prime,
                        query_groups=query_groups, item_groups=item_groups)


def candidate_pairs(candidates: ScoreResult, num_items: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Union of the candidate pairs of every top-k' list -> (query index, item index), sorted,
    unique."""
    codes = []
    for topk, items_are_rows in ((candidates.query_topk, False), (candidates.item_topk, True),
                                 (candidates.query_topk_grouped, False),
                                 (candidates.item_topk_grouped, True)):
        if topk is None:
            continue
        rows = torch.arange(topk.indices.shape[0])[:, None].expand_as(topk.indices)
        valid = topk.indices >= 0
        query, item = (topk.indices, rows) if items_are_rows else (rows, topk.indices)
        codes.append((query * num_items + item)[valid])
    unique = torch.unique(torch.cat(codes))  # sorted
    return unique // num_items, unique % num_items


def topk_from_pairs(rows: torch.Tensor, cols: torch.Tensor, scores: torch.Tensor,
                    sigma: torch.Tensor | None, num_rows: int, k: int,
                    valid: torch.Tensor | None = None) -> TopK:
    """Per row, the k best of its listed pairs (score desc, column asc) -> TopK, -1 padded."""
    keys = score_keys(scores, cols)  # (P,)
    if valid is not None:
        keys = keys.masked_fill(~valid, INVALID_KEY)
    order = torch.argsort(keys, descending=True, stable=True)  # best first
    order = order[torch.argsort(rows[order], stable=True)]  # group by row, keeping best first
    sorted_rows = rows[order]
    counts = torch.bincount(sorted_rows, minlength=num_rows)
    rank = torch.arange(len(order)) - (torch.cumsum(counts, 0) - counts)[sorted_rows]
    keep = rank < k
    out_keys = torch.full((num_rows, k), INVALID_KEY, dtype=torch.int64)
    out_keys[sorted_rows[keep], rank[keep]] = keys[order][keep]
    top_scores, indices = decode_keys(out_keys)
    out_sigma = None
    if sigma is not None:
        out_sigma = torch.full((num_rows, k), float("nan"))
        out_sigma[sorted_rows[keep], rank[keep]] = sigma[order][keep].float()
        out_sigma[indices < 0] = float("nan")
    return TopK(indices=indices, scores=top_scores, sigma=out_sigma)


def two_stage_score(scorer: ChunkedScorer, queries: torch.Tensor, items: torch.Tensor, *,
                    k: int = 10, k_items: int | None = None, k_prime: int = 100,
                    query_groups=None, item_groups=None) -> ScoreResult:
    """Cosine top-k' candidates in both directions, re-ranked by the scorer's head."""
    num_q, num_g = queries.shape[0], items.shape[0]
    k_q, k_g = min(k, num_g), min(k_items or k, num_q)
    if k_prime < max(k_q, k_g):
        raise ValueError(f"k_prime={k_prime} must be at least the requested k ({max(k_q, k_g)})")
    start = time.perf_counter()
    candidates = cosine_candidates(queries, items, k_prime, device=scorer.device,
                                   memory_budget_bytes=scorer.memory_budget_bytes,
                                   query_groups=query_groups, item_groups=item_groups)
    first_stage = time.perf_counter() - start
    q_idx, g_idx = candidate_pairs(candidates, num_g)
    logits, sigma = scorer.score_pairs(queries, items, q_idx, g_idx)
    result = ScoreResult(query_topk=topk_from_pairs(q_idx, g_idx, logits, sigma, num_q, k_q),
                         item_topk=topk_from_pairs(g_idx, q_idx, logits, sigma, num_g, k_g))
    if query_groups is not None:
        same = (torch.as_tensor(query_groups)[q_idx] == torch.as_tensor(item_groups)[g_idx])
        result.query_topk_grouped = topk_from_pairs(q_idx, g_idx, logits, sigma, num_q, k_q, same)
        result.item_topk_grouped = topk_from_pairs(g_idx, q_idx, logits, sigma, num_g, k_g, same)
    seconds = time.perf_counter() - start
    result.stats = {"pairs": len(q_idx), "pair_fraction": len(q_idx) / (num_q * num_g),
                    "seconds": seconds, "first_stage_seconds": first_stage, "k_prime": k_prime}
    return result


def topk_agreement(exact: TopK, approx: TopK) -> dict[str, float]:
    """How far an approximate top-k matches the exact one: same top-1 (percent of rows) and the
    mean overlap of the two top-k sets (percent)."""
    k = min(exact.indices.shape[1], approx.indices.shape[1])
    top1 = (exact.indices[:, 0] == approx.indices[:, 0]).float().mean().item()
    a, b = exact.indices[:, :k], approx.indices[:, :k]
    overlap = ((a[:, :, None] == b[:, None, :]) & (a[:, :, None] >= 0)).any(2).float().sum(1) / k
    return {"top1_agreement": 100.0 * top1, "overlap_at_k": 100.0 * overlap.mean().item()}
