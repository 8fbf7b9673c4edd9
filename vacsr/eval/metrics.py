"""Retrieval and classification metrics (paper appendix C.1: COCO R@K, ECCV Caption, CxC), exact to
the official protocol.

Rankings are deterministic: scores descending, exact ties broken by the lower item index. Every
metric can start from a dense score matrix or from top-k rankings (item indices, -1 = no item),
which is what the chunked scorer returns. Values are percentages computed in float64 in the same
order of operations as the `eccv_caption` package, so they agree with it to the last bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

INVALID_KEY = torch.iinfo(torch.int64).min  # sentinel key: "no item" (masked or missing)
_LOW_BITS = 2**32  # keys store the column index in their low 32 bits
_MAX_COLUMN = _LOW_BITS - 1


# ---------------------------------------------------------------- deterministic ranking keys
def score_keys(scores: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Unique int64 keys whose descending order is (score desc, column asc).

    scores (R, C) float, columns (C,) or (R, C) long in [0, 2**32) -> keys (R, C) int64.
    The high 32 bits hold an order-preserving image of the float32 score, the low 32 bits
    (2**32 - 1 - column), so a plain top-k on keys breaks exact ties towards the lower index.
    """
    high = sortable_high(scores)
    return high + (_MAX_COLUMN - columns)


def sortable_high(scores: torch.Tensor) -> torch.Tensor:
    """float scores (...) -> int64 (...) = sortable_int32(score) * 2**32."""
    bits = (scores.float() + 0.0).view(torch.int32)  # + 0.0 folds -0.0 into +0.0 (they tie)
    sortable = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats: reverse order
    return sortable.to(torch.int64) * _LOW_BITS


def decode_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of score_keys: keys (...) int64 -> (scores float32, columns long); -1 / -inf at
    sentinels."""
    sortable = keys >> 32  # arithmetic shift: floor division by 2**32
    columns = _MAX_COLUMN - (keys & _MAX_COLUMN)
    bits = torch.where(sortable < 0, sortable ^ 0x7FFFFFFF, sortable).to(torch.int32)
    scores = bits.view(torch.float32).clone()
    invalid = keys == INVALID_KEY
    return scores.masked_fill(invalid, float("-inf")), columns.masked_fill(invalid, -1)


def rank_topk(scores: torch.Tensor, k: int, valid: torch.Tensor | None = None,
              row_chunk: int = 256) -> torch.Tensor:
    """Indices (N, k) of each row's k best columns, deterministic ties; -1 where fewer are valid.

    scores (N, M) any real dtype; valid optional bool (N, M). Works in row chunks; int64 keys are
    built only for the few candidates at or above each row's k-th value, since every member of the
    top k (ties included) is among them.
    """
    num_rows, num_cols = scores.shape
    k = min(k, num_cols)
    out = torch.full((num_rows, k), -1, dtype=torch.long)
    for start in range(0, num_rows, row_chunk):
        values = scores[start:start + row_chunk].float().contiguous()  # (r, M); .T inputs too
        mask = None if valid is None else valid[start:start + row_chunk]
        out[start:start + row_chunk] = _rank_chunk(values, k, mask).cpu()
    return out


def _rank_chunk(values: torch.Tensor, k: int, valid: torch.Tensor | None) -> torch.Tensor:
    """values (r, M) float32 -> top-k column indices (r, k), -1 padded."""
    if valid is not None:
        values = values.masked_fill(~valid, float("-inf"))
    kth = values.topk(k, dim=1).values[:, -1:]  # (r, 1): any top-k member scores >= kth
    candidates = values >= kth  # k per row plus the ties at the k-th value
    if valid is not None:
        candidates &= valid
    rows, cols = torch.nonzero(candidates).unbind(1)  # row-major, columns ascending
    counts = torch.bincount(rows, minlength=values.shape[0])
    slot = torch.arange(len(rows), device=rows.device) - (torch.cumsum(counts, 0) - counts)[rows]
    keys = torch.full((values.shape[0], max(int(counts.max()), k)), INVALID_KEY,
                      dtype=torch.int64, device=values.device)  # (r, width)
    keys[rows, slot] = score_keys(values[rows, cols], cols)
    return decode_keys(keys.topk(k, dim=1).values)[1]


# ---------------------------------------------------------------- ground truth
@dataclass(frozen=True)
class Positives:
    """Ground-truth positives of each query as sorted pair codes (query * num_items + item).

    counts[q] is the number R of distinct positives of query q; it may exceed the positives found in
    the gallery (ECCV Caption lists two captions outside the COCO 5K test set; they count in R).
    """

    codes: torch.Tensor  # (P,) int64, sorted
    counts: torch.Tensor  # (N_q,) long
    num_items: int

    @classmethod
    def from_assignment(cls, item_to_query, num_queries: int) -> "Positives":
        """Each item belongs to one query (COCO: caption -> image index)."""
        item_to_query = torch.as_tensor(np.asarray(item_to_query), dtype=torch.long).cpu()
        items = torch.arange(len(item_to_query))
        codes = torch.sort(item_to_query * len(item_to_query) + items).values
        counts = torch.bincount(item_to_query, minlength=num_queries)
        return cls(codes=codes, counts=counts, num_items=len(item_to_query))

    @classmethod
    def from_lists(cls, lists: Sequence[Sequence[int]], num_items: int,
                   counts: Sequence[int] | None = None) -> "Positives":
        """lists[q] = positive item indices of query q (-1 entries: outside the gallery)."""
        pairs = [(q, i) for q, items in enumerate(lists) for i in set(items) if i >= 0]
        pair_tensor = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)
        codes = torch.sort(pair_tensor[:, 0] * num_items + pair_tensor[:, 1]).values
        if counts is None:
            counts = [len(set(items)) for items in lists]
        return cls(codes=codes, counts=torch.as_tensor(counts, dtype=torch.long),
                   num_items=num_items)

    def relevance(self, ranked: torch.Tensor,
                  query_index: torch.Tensor | None = None) -> torch.Tensor:
        """ranked (N, k) item indices (-1 = none) of queries query_index (default 0..N-1) -> bool
        (N, k)."""
        ranked = ranked.cpu().long()
        if query_index is None:
            query_index = torch.arange(ranked.shape[0])
        codes = query_index.long()[:, None] * self.num_items + ranked  # (N, k)
        return torch.isin(codes, self.codes) & (ranked >= 0)


# ---------------------------------------------------------------- retrieval metrics
def hit_fraction(relevance: torch.Tensor, k: int) -> float:
    """Fraction of queries with a positive in their top k: count / N, as np.mean over 0/1 gives."""
    return int(relevance[:, :k].any(dim=1).sum()) / relevance.shape[0]


def recall_from_relevance(relevance: torch.Tensor, k: int) -> float:
    """R@k in percent."""
    return 100.0 * hit_fraction(relevance, k)


def precision_at_r(relevance_row: np.ndarray, num_positives: int) -> tuple[float, float]:
    """One query's (mAP@R, R-Precision), both fractions; relevance_row bool (>= R,).

    P@r is computed as 1 - (#non-relevant in top r) / r, the order of operations of eccv_caption,
    so the float64 results match it exactly.
    """
    r = np.arange(1, num_positives + 1)
    rel = relevance_row[:num_positives]
    non_relevant = r - np.cumsum(rel)
    precision = 1 - non_relevant / r  # (R,)
    map_terms = np.where(rel, precision, 0.0)
    return float(np.mean(map_terms)), float(precision[-1])


def map_at_r(relevance: torch.Tensor, counts: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-query (mAP@R, R-Precision) fractions; relevance bool (N, >= max R), counts R (N,)."""
    if relevance.shape[1] < int(counts.max()):
        raise ValueError(f"rankings hold {relevance.shape[1]} items but a query has R = "
                         f"{int(counts.max())} positives; score with k >= max R")
    rel = relevance.numpy()
    values = [precision_at_r(rel[q], int(counts[q])) for q in range(rel.shape[0])]
    maps, rps = zip(*values) if values else ((), ())
    return np.asarray(maps, dtype=np.float64), np.asarray(rps, dtype=np.float64)


def coco_recalls(i2t_ranked: torch.Tensor, t2i_ranked: torch.Tensor, caption_to_image,
                 ks: Sequence[int] = (1, 5, 10), prefix: str = "") -> dict[str, float]:
    """R@K both directions and RSUM from rankings: i2t (N_i, k) caption indices, t2i (N_c, k)
    image indices."""
    caption_to_image = torch.as_tensor(np.asarray(caption_to_image), dtype=torch.long).cpu()
    num_images = i2t_ranked.shape[0]
    i2t_pos = Positives.from_assignment(caption_to_image, num_images)
    i2t_rel = i2t_pos.relevance(i2t_ranked)
    t2i_ranked = t2i_ranked.cpu().long()
    t2i_rel = (t2i_ranked == caption_to_image[:, None]) & (t2i_ranked >= 0)
    result = {}
    for k in ks:
        result[f"{prefix}i2t_r{k}"] = recall_from_relevance(i2t_rel, k)
        result[f"{prefix}t2i_r{k}"] = recall_from_relevance(t2i_rel, k)
    result[f"{prefix}rsum"] = sum(result[f"{prefix}{d}_r{k}"] for d in ("i2t", "t2i") for k in ks)
    return result


def fold_groups(caption_to_image, num_images: int,
                num_folds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """COCO 1K folds: image i in fold i // (N_i / folds), a caption in its image's fold."""
    if num_images % num_folds:
        raise ValueError(f"{num_images} images do not split into {num_folds} equal folds")
    image_groups = torch.arange(num_images) // (num_images // num_folds)
    caption_groups = image_groups[torch.as_tensor(np.asarray(caption_to_image), dtype=torch.long)]
    return image_groups, caption_groups


def coco_fold_recalls(i2t_fold_ranked: torch.Tensor, t2i_fold_ranked: torch.Tensor,
                      caption_to_image, num_folds: int = 5, ks: Sequence[int] = (1, 5, 10),
                      prefix: str = "coco1k_") -> dict[str, float]:
    """COCO 1K: mean over folds of R@K, from rankings restricted to each query's own fold."""
    caption_to_image = torch.as_tensor(np.asarray(caption_to_image), dtype=torch.long).cpu()
    image_groups, caption_groups = fold_groups(caption_to_image, i2t_fold_ranked.shape[0],
                                               num_folds)
    positives = Positives.from_assignment(caption_to_image, len(image_groups))
    per_fold: dict[str, list[float]] = {}
    for fold in range(num_folds):
        images = torch.nonzero(image_groups == fold).squeeze(1)
        captions = torch.nonzero(caption_groups == fold).squeeze(1)
        i2t_rel = positives.relevance(i2t_fold_ranked[images], images)
        t2i = t2i_fold_ranked[captions].long()
        t2i_rel = (t2i == caption_to_image[captions][:, None]) & (t2i >= 0)
        for k in ks:
            per_fold.setdefault(f"i2t_r{k}", []).append(hit_fraction(i2t_rel, k))
            per_fold.setdefault(f"t2i_r{k}", []).append(hit_fraction(t2i_rel, k))
    result = {f"{prefix}{name}": 100.0 * float(np.mean(values))
              for name, values in per_fold.items()}
    result[f"{prefix}rsum"] = sum(result[f"{prefix}{d}_r{k}"] for d in ("i2t", "t2i") for k in ks)
    return result


def fold_rankings(scores: torch.Tensor, caption_to_image, num_folds: int, depth: int):
    """Within-fold rankings of a dense (N_i, N_c) matrix: (i2t (N_i, depth), t2i (N_c, depth)),
    global indices, each query ranked against its own fold only."""
    image_groups, caption_groups = fold_groups(caption_to_image, scores.shape[0], num_folds)
    i2t = torch.full((scores.shape[0], depth), -1, dtype=torch.long)
    t2i = torch.full((scores.shape[1], depth), -1, dtype=torch.long)
    for fold in range(num_folds):
        images = torch.nonzero(image_groups == fold).squeeze(1)
        captions = torch.nonzero(caption_groups == fold).squeeze(1)
        block = scores[images][:, captions]  # (n_i, n_c)
        local = rank_topk(block, depth)
        i2t[images, :local.shape[1]] = torch.where(local >= 0, captions[local.clamp(min=0)], -1)
        local = rank_topk(block.T, depth)
        t2i[captions, :local.shape[1]] = torch.where(local >= 0, images[local.clamp(min=0)], -1)
    return i2t, t2i


def retrieval_metrics(scores: torch.Tensor, caption_to_image, ks=(1, 5, 10),
                      num_folds: int | None = None) -> dict[str, float]:
    """R@K (percent) both directions and RSUM from an (N_images, N_captions) score matrix.

    With num_folds (5 for COCO 5K) the fold means (COCO 1K protocol) are added as coco1k_*.
    """
    scores = scores.detach().cpu()
    depth = max(ks)
    result = coco_recalls(rank_topk(scores, depth), rank_topk(scores.T, depth), caption_to_image,
                          ks)
    if num_folds:
        i2t, t2i = fold_rankings(scores, caption_to_image, num_folds, depth)
        result.update(coco_fold_recalls(i2t, t2i, caption_to_image, num_folds, ks))
    return result


# ---------------------------------------------------------------- classification
def accuracy_from_predictions(predictions, labels) -> float:
    """Micro accuracy (percent) of predicted class indices (N,) against labels (N,)."""
    predictions = torch.as_tensor(np.asarray(predictions)).cpu().long()
    labels = torch.as_tensor(np.asarray(labels)).cpu().long()
    return 100.0 * (int((predictions == labels).sum()) / len(labels))
