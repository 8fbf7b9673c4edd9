"""ECCV Caption and CxC metrics on the COCO 5K test set (paper appendix C.1, Table 2).

The ground truth is the one shipped in the `eccv_caption` package (MIT), read from its data files:
COCO caption ids in Karpathy test order (5 consecutive per image) and, per dataset, query id ->
positive ids in both directions. The metrics themselves are vectorised re-implementations that
reproduce the package's numbers exactly (same R, same order of float operations, same query order).
"""
from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from vacsr.eval.metrics import Positives, hit_fraction, map_at_r

DIRECTIONS = ("i2t", "t2i")


@dataclass(frozen=True)
class CocoTestGroundTruth:
    image_ids: np.ndarray  # (5000,) COCO image ids, Karpathy test order
    caption_ids: np.ndarray  # (25000,) COCO caption annotation ids, 5 consecutive per image
    caption_to_image: np.ndarray  # (25000,) index into image_ids
    gts: dict  # {"coco" | "cxc" | "eccv": {"i2t" | "t2i": {query id: [positive ids]}}}, file order


def _data_dir() -> Path:
    # Locate the package without importing it (its import warns about a missing optional ujson).
    spec = importlib.util.find_spec("eccv_caption")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the eccv_caption package is required for ECCV Caption / CxC metrics")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def _read_gt(path: Path) -> dict[int, list[int]]:
    with open(path) as handle:  # dict order = file order = the package's query order
        return {int(key): [int(v) for v in values] for key, values in json.load(handle).items()}


@functools.lru_cache(maxsize=1)
def load_coco_test_ground_truth() -> CocoTestGroundTruth:
    """The COCO 5K test ids and the COCO / CxC / ECCV Caption positives shipped in eccv_caption."""
    data = _data_dir()
    gts = {}
    for name, stem in (("coco", "original"), ("cxc", "cxc"), ("eccv", "eccv")):
        gts[name] = {"i2t": _read_gt(data / f"{stem}_image_to_caption.json"),
                     "t2i": _read_gt(data / f"{stem}_caption_to_image.json")}
    caption_ids = np.load(data / "coco_test_ids.npy").astype(np.int64)
    caption_image = np.array([gts["coco"]["t2i"][int(c)][0] for c in caption_ids], dtype=np.int64)
    image_ids = caption_image[::5]
    if not np.array_equal(np.repeat(image_ids, 5), caption_image):
        raise ValueError("eccv_caption test ids are not 5 consecutive captions per image")
    caption_to_image = np.repeat(np.arange(len(image_ids)), 5)
    return CocoTestGroundTruth(image_ids=image_ids, caption_ids=caption_ids,
                               caption_to_image=caption_to_image, gts=gts)


def _index(ids) -> dict[int, int]:
    return {int(v): i for i, v in enumerate(np.asarray(ids))}


def gt_positives(gt: dict[int, list[int]], query_ids, item_ids) -> tuple[torch.Tensor, Positives]:
    """GT dict -> (query indices (M,) in GT order, Positives over M rows in the same order).

    Positive ids missing from the gallery keep counting in R (the package counts them too).
    """
    query_index, item_index = _index(query_ids), _index(item_ids)
    missing = [q for q in gt if q not in query_index]
    if missing:
        raise KeyError(f"{len(missing)} ground-truth queries are not among the given ids "
                       f"(first: {missing[0]}); ECCV / CxC need the COCO 5K test set")
    rows = torch.tensor([query_index[q] for q in gt], dtype=torch.long)
    lists = [[item_index.get(i, -1) for i in items] for items in gt.values()]
    counts = [len(set(items)) for items in gt.values()]
    return rows, Positives.from_lists(lists, len(item_index), counts)


def _relevance(ranked: torch.Tensor, gt: dict, query_ids, item_ids):
    rows, positives = gt_positives(gt, query_ids, item_ids)
    ranked = ranked.cpu().long()[rows]  # (M, k), GT order
    return positives.relevance(ranked), positives.counts


def _ids(ground_truth: CocoTestGroundTruth | None, image_ids, caption_ids):
    ground_truth = ground_truth or load_coco_test_ground_truth()
    image_ids = ground_truth.image_ids if image_ids is None else np.asarray(image_ids)
    caption_ids = ground_truth.caption_ids if caption_ids is None else np.asarray(caption_ids)
    return ground_truth, {"i2t": (image_ids, caption_ids), "t2i": (caption_ids, image_ids)}


def eccv_caption_metrics(i2t_ranked: torch.Tensor, t2i_ranked: torch.Tensor, image_ids=None,
                         caption_ids=None, ground_truth: CocoTestGroundTruth | None = None
                         ) -> dict[str, float]:
    """ECCV Caption mAP@R, R-Precision and R@1 (percent), both directions.

    i2t_ranked (N_i, k) caption indices, t2i_ranked (N_c, k) image indices; ids map indices to
    COCO ids (default: Karpathy test order). k must reach the largest R (eccv_depth()).
    """
    ground_truth, ids = _ids(ground_truth, image_ids, caption_ids)
    result = {}
    for direction, ranked in zip(DIRECTIONS, (i2t_ranked, t2i_ranked)):
        relevance, counts = _relevance(ranked, ground_truth.gts["eccv"][direction], *ids[direction])
        maps, rprecisions = map_at_r(relevance, counts)
        result[f"eccv_map_at_r_{direction}"] = 100.0 * float(np.mean(maps))
        result[f"eccv_rprecision_{direction}"] = 100.0 * float(np.mean(rprecisions))
        result[f"eccv_r1_{direction}"] = 100.0 * hit_fraction(relevance, 1)
    return result


def cxc_recalls(i2t_ranked: torch.Tensor, t2i_ranked: torch.Tensor, image_ids=None,
                caption_ids=None, ks: Sequence[int] = (1, 5, 10),
                ground_truth: CocoTestGroundTruth | None = None) -> dict[str, float]:
    """CxC R@K (percent) with the extended positives, both directions, and their sum."""
    ground_truth, ids = _ids(ground_truth, image_ids, caption_ids)
    result = {}
    for direction, ranked in zip(DIRECTIONS, (i2t_ranked, t2i_ranked)):
        relevance, _ = _relevance(ranked, ground_truth.gts["cxc"][direction], *ids[direction])
        for k in ks:
            result[f"cxc_{direction}_r{k}"] = 100.0 * hit_fraction(relevance, k)
    result["cxc_rsum"] = sum(result[f"cxc_{d}_r{k}"] for d in DIRECTIONS for k in ks)
    return result


def eccv_depth(ground_truth: CocoTestGroundTruth | None = None) -> dict[str, int]:
    """Ranking depth each direction needs for mAP@R: the largest number of ECCV positives R."""
    gts = (ground_truth or load_coco_test_ground_truth()).gts["eccv"]
    return {d: max(len(set(v)) for v in gts[d].values()) for d in DIRECTIONS}


def covers_coco_test(image_ids, caption_ids) -> bool:
    """True when the given ids contain every ECCV / CxC query (the COCO 5K test set)."""
    ground_truth = load_coco_test_ground_truth()
    images, captions = set(np.asarray(image_ids).tolist()), set(np.asarray(caption_ids).tolist())
    return (set(ground_truth.image_ids.tolist()) <= images
            and set(ground_truth.caption_ids.tolist()) <= captions)
