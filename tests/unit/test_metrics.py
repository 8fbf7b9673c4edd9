"""Metrics: deterministic ranking keys, hand-checked values, and an exact cross-check against the
official eccv_caption package on the real COCO 5K test ids it ships."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from vacsr.eval.eccv import (
    cxc_recalls,
    eccv_caption_metrics,
    eccv_depth,
    load_coco_test_ground_truth,
)
from vacsr.eval.metrics import (
    INVALID_KEY,
    coco_fold_recalls,
    coco_recalls,
    decode_keys,
    fold_rankings,
    map_at_r,
    rank_topk,
    retrieval_metrics,
    score_keys,
)
from vacsr.results import harmonic_mean
from vacsr.sweep.report.table import table_rows


# ---------------------------------------------------------------- ranking keys
def test_keys_order_scores_then_lower_index_and_round_trip():
    scores = torch.tensor([[1.5, -0.0, 0.0, -2.0, float("inf"), -1e-30, 1.5, float("-inf")]])
    columns = torch.arange(scores.shape[1])
    keys = score_keys(scores, columns)
    order = keys.argsort(dim=1, descending=True)[0].tolist()
    # -0.0 and 0.0 tie (lower index first); 1.5 at columns 0 and 6 tie (0 first)
    assert order == [4, 0, 6, 1, 2, 5, 3, 7]
    values, cols = decode_keys(keys)
    assert torch.equal(cols, columns[None])
    assert torch.equal(values, scores + 0.0)  # exact round trip (-0.0 folds into 0.0)
    assert decode_keys(torch.tensor([INVALID_KEY]))[1].item() == -1


def test_rank_topk_matches_stable_sort_with_ties_and_masks():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (37, 53), generator=gen).float()  # heavy ties
    expected = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :7]
    assert torch.equal(rank_topk(scores, 7, row_chunk=5), expected)
    valid = torch.rand(37, 53, generator=gen) > 0.9
    ranked = rank_topk(scores, 7, valid=valid)
    for row in range(37):
        allowed = torch.nonzero(valid[row]).squeeze(1)
        ref = allowed[torch.sort(scores[row, allowed], descending=True, stable=True).indices][:7]
        got = ranked[row][ranked[row] >= 0]
        assert torch.equal(got, ref)


# ---------------------------------------------------------------- hand-checked values
def test_retrieval_metrics_hand_example():
    # 2 images, 4 captions (0,1 -> image 0; 2,3 -> image 1)
    scores = torch.tensor([[0.1, 0.9, 0.9, 0.0],    # i2t: ranks 1 (tie with 2 won by lower index)
                           [0.5, 0.5, 0.2, 0.1]])   # i2t: positives at ranks 3, 4
    result = retrieval_metrics(scores, [0, 0, 1, 1], ks=(1, 2))
    assert result["i2t_r1"] == 50.0 and result["i2t_r2"] == 50.0
    # t2i: caption 0 -> image 1 first (0.5 > 0.1); caption 1: 0.9 vs 0.5 -> image 0;
    # caption 2: 0.9 vs 0.2 -> image 0 (wrong); caption 3: 0.0 vs 0.1 -> image 1
    assert result["t2i_r1"] == 50.0 and result["t2i_r2"] == 100.0
    assert result["rsum"] == 250.0


def test_map_at_r_hand_example():
    # R = 3, relevant at ranks 1 and 3: mAP@R = (1 + 0 + 2/3) / 3, R-P = 2/3
    relevance = torch.tensor([[True, False, True, True]])
    maps, rps = map_at_r(relevance, torch.tensor([3]))
    assert maps[0] == pytest.approx((1 + 2 / 3) / 3) and rps[0] == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        map_at_r(relevance, torch.tensor([5]))  # ranking too short for R


def test_h_is_taken_from_the_seed_averaged_base_and_novel():
    """The sweep's table (paper sec. 4.1): H of a row = H(mean base, mean novel), not the mean of
    the per-seed H."""
    assert harmonic_mean(0.0, 0.0) == 0.0
    spec = {"columns": [["base", "acc"], ["novel", "novel_acc"]], "harmonic": ["base", "novel"],
            "published": {}}
    results = {"ds": {"per_seed": [{"seed": 1, "acc": 80.0, "novel_acc": 40.0},
                                   {"seed": 2, "acc": 60.0, "novel_acc": 80.0}], "val": 75.0}}
    row = next(r for r in table_rows(spec, results) if r["dataset"] == "ds")
    assert row["base"] == 70.0 and row["novel"] == 60.0
    assert row["H"] == pytest.approx(2 * 70 * 60 / 130) == harmonic_mean(70.0, 60.0)
    assert row["H"] != pytest.approx(np.mean([harmonic_mean(80, 40), harmonic_mean(60, 80)]))


# ---------------------------------------------------------------- cross-check with eccv_caption
@pytest.fixture(scope="module")
def official():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from eccv_caption import Metrics
        return Metrics()


def _coco_scores(seed: int) -> torch.Tensor:
    """(5000, 25000) int16 scores: negatives uniform in [0, 20000), positives in [18000, 22000).
    Even caption columns are coarsened to multiples of 100, so both directions see many exact ties
    at the top of their rankings (and odd columns keep fine-grained scores)."""
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 20000, size=(5000, 25000), dtype=np.int16)
    images = np.repeat(np.arange(5000), 5)
    scores[images, np.arange(25000)] = rng.integers(18000, 22000, size=25000, dtype=np.int16)
    scores[:, ::2] -= scores[:, ::2] % 100
    return torch.from_numpy(scores)


def _reference_lists(scores: np.ndarray, row_ids, col_ids, depth: int, col_fold, row_fold, k_fold):
    """Independent numpy ranking (stable argsort: lower index first) -> {row id: [col ids]}.

    Each list is the full ranking's prefix that holds the top `depth` overall and the top `k_fold`
    items of the row's own fold, so eccv_caption's 1K filter sees the exact within-fold ranking."""
    lists = {}
    for start in range(0, scores.shape[0], 250):
        chunk = np.ascontiguousarray(scores[start:start + 250]).astype(np.int16)
        order = np.argsort(-chunk, axis=1, kind="stable")[:, :400]  # radix sort: stable, fast
        same_fold = col_fold[order] == row_fold[start:start + 250, None]
        assert same_fold.sum(axis=1).min() >= k_fold  # the 400-prefix holds k_fold own-fold items
        fold_depth = np.argmax(np.cumsum(same_fold, axis=1) >= k_fold, axis=1) + 1
        for offset, row in enumerate(order):
            length = max(depth, int(fold_depth[offset]))
            lists[int(row_ids[start + offset])] = col_ids[row[:length]].tolist()
    return lists


@pytest.mark.timeout(240)
def test_all_metrics_equal_eccv_caption_on_coco_5k(official):
    gt = load_coco_test_ground_truth()
    assert np.array_equal(gt.caption_ids, official.coco_ids)
    scores = _coco_scores(seed=0)
    depth = eccv_depth(gt)
    i2t = rank_topk(scores, max(depth["i2t"], 10))
    t2i = rank_topk(scores.T, max(depth["t2i"], 10))
    for ranked, matrix in ((i2t, scores), (t2i, scores.T)):
        top = matrix.gather(1, ranked[:, :10])  # (N, 10) ranked scores
        tie_rate = (top[:, 1:] == top[:, :-1]).any(dim=1).float().mean()
        assert tie_rate > 0.5  # most queries have exact ties within their top 10

    ours = coco_recalls(i2t, t2i, gt.caption_to_image)
    ours.update(coco_fold_recalls(*fold_rankings(scores, gt.caption_to_image, 5, 10),
                                  gt.caption_to_image))
    ours.update(eccv_caption_metrics(i2t, t2i))
    ours.update(cxc_recalls(i2t, t2i))

    image_fold = np.arange(5000) // 1000
    caption_fold = np.repeat(image_fold, 5)
    np_scores = scores.numpy()
    retrieved = {
        "i2t": _reference_lists(np_scores, gt.image_ids, gt.caption_ids, i2t.shape[1],
                                caption_fold, image_fold, 10),
        "t2i": _reference_lists(np_scores.T, gt.caption_ids, gt.image_ids, t2i.shape[1],
                                image_fold, caption_fold, 10),
    }
    checked = 0
    for k in (1, 5, 10):
        for name, fn in (("", official.coco_5k_recalls), ("coco1k_", official.coco_1k_recalls),
                         ("cxc_", official.cxc_recalls)):
            theirs = fn(retrieved, "all", K=k)
            for direction in ("i2t", "t2i"):
                assert ours[f"{name}{direction}_r{k}"] == 100.0 * theirs[direction], (name, k)
                checked += 1
    for metric, values in official.eccv_metrics(retrieved, "all").items():
        for direction in ("i2t", "t2i"):
            assert ours[f"{metric}_{direction}"] == 100.0 * float(values[direction]), metric
            checked += 1
    assert checked == 24
    assert 0 < ours["i2t_r1"] < 100 and 0 < ours["eccv_map_at_r_t2i"] < 100  # non-trivial values


def test_retrieval_metrics_from_scores_equals_rank_path():
    gen = torch.Generator().manual_seed(3)
    scores = torch.randint(0, 6, (50, 250), generator=gen).float()
    caption_to_image = torch.arange(250) // 5
    expected = coco_recalls(rank_topk(scores, 10), rank_topk(scores.T, 10), caption_to_image)
    expected.update(coco_fold_recalls(*fold_rankings(scores, caption_to_image, 5, 10),
                                      caption_to_image))
    assert retrieval_metrics(scores, caption_to_image, num_folds=5) == expected
    # the fold ranking only ever returns items of the query's own fold
    i2t, _ = fold_rankings(scores, caption_to_image, 5, 10)
    assert torch.equal(caption_to_image[i2t] // 10,
                       (torch.arange(50) // 10)[:, None].expand(-1, 10))
