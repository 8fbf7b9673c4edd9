"""Semantic retrieval metrics: ECCV Caption's mAP@R, R-Precision and R@1 on group ground truth.

COCO's binary annotation counts only an image's own captions as its positives, so a caption that
describes another image just as well is scored as a miss: a false negative (paper section 1).
ECCV Caption (Chun et al. 2022, the benchmark of paper appendix C.1 and Tables 2-3) adds those
positives and reports mAP@R, R-Precision and R@1 over them, which are less sensitive to FNs than
R@1 on binary labels (paper section 4.3, "Metric Sensitivity"). When a dataset declares semantic
groups (one integer per image, e.g. the scene of the synthetic data), the same metrics apply with
positives = every item of the query's group:
    image i   -> every caption of every image of group g(i)         (R = captions of the group)
    caption j -> every image of group g(caption_to_image[j])        (R = images of the group)
All positives are in the gallery, so R is exact and the rankings need depth max R (semantic_depth).
The metric code is metrics.map_at_r and metrics.hit_fraction, as for ECCV Caption (eccv.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vacsr.eval.metrics import hit_fraction, map_at_r

DIRECTIONS = ("i2t", "t2i")
PREFIX = "sem_"


@dataclass(frozen=True)
class GroupPositives:
    """Positives by group equality, with the `counts` / `relevance` interface of metrics.Positives
    but no list of pairs: memory O(N k) for rankings of depth k, not O(sum of R)."""

    query_groups: torch.Tensor  # (N_q,) long, dense group index 0..G-1
    item_groups: torch.Tensor  # (N_g,) long, same index space

    @property
    def counts(self) -> torch.Tensor:
        """R per query (N_q,): the number of gallery items in its group."""
        num_groups = int(torch.cat([self.query_groups, self.item_groups]).max()) + 1
        return torch.bincount(self.item_groups, minlength=num_groups)[self.query_groups]

    def relevance(self, ranked: torch.Tensor,
                  query_index: torch.Tensor | None = None) -> torch.Tensor:
        """ranked (N, k) item indices (-1 = none) of queries query_index (default 0..N-1)
        -> bool (N, k): the ranked item is in the query's group."""
        ranked = ranked.cpu().long()
        if query_index is None:
            query_index = torch.arange(ranked.shape[0])
        ranked_groups = self.item_groups[ranked.clamp(min=0)]  # (N, k)
        return (ranked_groups == self.query_groups[query_index.long(), None]) & (ranked >= 0)


def group_positives(image_groups, caption_to_image) -> dict[str, GroupPositives]:
    """{"i2t": image queries over captions, "t2i": caption queries over images}.

    image_groups (N_i,) any integers, caption_to_image (N_c,) image index per caption.
    """
    raw = torch.as_tensor(np.asarray(image_groups), dtype=torch.long).cpu()
    image_group = torch.unique(raw, return_inverse=True)[1]  # (N_i,) dense 0..G-1
    caption_image = torch.as_tensor(np.asarray(caption_to_image), dtype=torch.long).cpu()
    caption_group = image_group[caption_image]  # (N_c,)
    return {"i2t": GroupPositives(image_group, caption_group),
            "t2i": GroupPositives(caption_group, image_group)}


def semantic_depth(image_groups, caption_to_image) -> dict[str, int]:
    """Ranking depth each direction needs for exact mAP@R / R-P: the largest R."""
    positives = group_positives(image_groups, caption_to_image)
    return {d: int(p.counts.max()) for d, p in positives.items()}


def semantic_metrics(i2t_ranked: torch.Tensor, t2i_ranked: torch.Tensor, image_groups,
                     caption_to_image, prefix: str = PREFIX) -> dict[str, float]:
    """mAP@R, R-Precision and R@1 (percent) with group positives, both directions and their means.

    i2t_ranked (N_i, k) caption indices, t2i_ranked (N_c, k) image indices, k >= semantic_depth.
    Keys: {prefix}map_at_r_{i2t,t2i}, {prefix}rprecision_*, {prefix}r1_*, and {prefix}map_at_r,
    {prefix}rprecision, {prefix}r1 (mean of the two directions). Queries with R = 0 (an image whose
    group has no caption) have nothing to retrieve and are left out, as ECCV Caption lists only
    queries with positives.
    """
    positives = group_positives(image_groups, caption_to_image)
    result = {}
    for direction, ranked in zip(DIRECTIONS, (i2t_ranked, t2i_ranked)):
        counts = positives[direction].counts  # (N_q,)
        queries = torch.nonzero(counts > 0).squeeze(1)  # (M,)
        relevance = positives[direction].relevance(ranked.cpu().long()[queries], queries)  # (M, k)
        maps, rprecisions = map_at_r(relevance, counts[queries])
        result[f"{prefix}map_at_r_{direction}"] = 100.0 * float(np.mean(maps))
        result[f"{prefix}rprecision_{direction}"] = 100.0 * float(np.mean(rprecisions))
        result[f"{prefix}r1_{direction}"] = 100.0 * hit_fraction(relevance, 1)
    for name in ("map_at_r", "rprecision", "r1"):
        result[f"{prefix}{name}"] = (result[f"{prefix}{name}_i2t"]
                                     + result[f"{prefix}{name}_t2i"]) / 2
    return result
