"""Evaluation entry points: features + head -> a flat dict of metrics (paper sec. 4, appendices
C-D).

The tasks (vacsr/tasks.py) call these; the CLI, the trainer and the sweep reach them through a
task. Scoring goes through a scorer object: a local `ChunkedScorer` by default, or anything with
the same `score(queries, items, ...)` method (e.g. `vacsr.distributed.EvalPool`, which scores on
Ray actors).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from vacsr.eval import eccv
from vacsr.eval.metrics import (
    accuracy_from_predictions,
    coco_fold_recalls,
    coco_recalls,
    fold_groups,
)
from vacsr.eval.scorer import ChunkedScorer, ScoreResult
from vacsr.eval.semantic import semantic_depth, semantic_metrics
from vacsr.eval.two_stage import two_stage_score
from vacsr.eval.uncertainty import plot_uncertainty, uncertainty_analysis


@dataclass
class RetrievalEvaluation:
    metrics: dict[str, float]
    result: ScoreResult
    uncertainty: dict | None  # per direction: bins, R@1 per bin, Pearson (None without sigma_hat)


def evaluate_retrieval(image_feats: torch.Tensor, text_feats: torch.Tensor, head: nn.Module,
                       caption_to_image, image_ids=None, caption_ids=None,
                       **kwargs) -> dict[str, float]:
    """Image-text retrieval metrics as a flat dict of floats; see evaluate_retrieval_detailed."""
    return evaluate_retrieval_detailed(image_feats, text_feats, head, caption_to_image,
                                       image_ids, caption_ids, **kwargs).metrics


def evaluate_retrieval_detailed(image_feats: torch.Tensor, text_feats: torch.Tensor,
                                head: nn.Module, caption_to_image, image_ids=None,
                                caption_ids=None, *,
                                ks: Sequence[int] = (1, 5, 10), num_folds: int | None = None,
                                eccv_metrics: bool | None = None, two_stage_k: int | None = None,
                                memory_budget_bytes: int = 256 * 2**20, device=None,
                                precision: str = "auto", scorer=None, uncertainty_plot=None,
                                num_bins: int = 10, image_groups=None) -> RetrievalEvaluation:
    """image_feats (N_i, d), text_feats (N_c, d), caption_to_image (N_c,) image index per caption.

    - R@K both directions and RSUM over the whole set (COCO 5K when it is COCO test);
    - num_folds=5: COCO 1K, the mean over 5 folds of N_i / 5 images (coco1k_*);
    - ECCV Caption (mAP@R, R-P, R@1) and CxC R@K when image_ids / caption_ids (COCO ids) cover the
      COCO 5K test set: eccv_metrics None = when they do, True = required, False = never;
    - image_groups (N_i,) semantic group per image (extended ground truth, e.g. the synthetic
      scene): the same mAP@R, R-P and R@1 with positives = the query's whole group (sem_*);
    - two_stage_k=k': cosine top-k' candidates re-ranked by the head instead of exact scoring;
    - uncertainty (Fig. 3) Pearson r per direction when the head has sigma_hat; with
      uncertainty_plot=path also the PNG.
    scorer: a ChunkedScorer or EvalPool to use (head, memory_budget_bytes, device and precision
    then unused; precision is the ChunkedScorer's: auto, fp32 or bf16).
    """
    use_eccv = _want_eccv(eccv_metrics, image_ids, caption_ids)
    depth_i2t, depth_t2i = _depths(ks, use_eccv, image_groups, caption_to_image)
    groups = {}
    if num_folds:
        image_folds, caption_folds = fold_groups(caption_to_image, image_feats.shape[0], num_folds)
        groups = {"query_groups": image_folds, "item_groups": caption_folds}
    scorer = scorer or ChunkedScorer(head, memory_budget_bytes=memory_budget_bytes, device=device,
                                     precision=precision)
    if two_stage_k:
        result = two_stage_score(scorer, image_feats, text_feats, k=depth_i2t, k_items=depth_t2i,
                                 k_prime=max(two_stage_k, depth_i2t, depth_t2i), **groups)
    else:
        result = scorer.score(image_feats, text_feats, k=depth_i2t, k_items=depth_t2i, **groups)
    i2t, t2i = result.query_topk.indices, result.item_topk.indices
    metrics = coco_recalls(i2t, t2i, caption_to_image, ks)
    if num_folds:
        metrics.update(coco_fold_recalls(result.query_topk_grouped.indices,
                                         result.item_topk_grouped.indices, caption_to_image,
                                         num_folds, ks))
    if use_eccv:
        metrics.update(eccv.eccv_caption_metrics(i2t, t2i, image_ids, caption_ids))
        metrics.update(eccv.cxc_recalls(i2t, t2i, image_ids, caption_ids, ks))
    if image_groups is not None:
        metrics.update(semantic_metrics(i2t, t2i, image_groups, caption_to_image))
    analysis = None
    if result.query_topk.sigma is not None:
        analysis = uncertainty_analysis(result, caption_to_image, num_bins)
        for direction, bins in analysis.items():
            metrics[f"uncertainty_{direction}_pearson"] = bins["pearson_bins"]
            topk = result.query_topk if direction == "i2t" else result.item_topk
            metrics[f"sigma_top1_{direction}_mean"] = float(np.nanmean(topk.sigma[:, 0].numpy()))
        if uncertainty_plot is not None:
            plot_uncertainty(analysis, uncertainty_plot)
    metrics["eval_seconds"] = float(result.stats.get("seconds", float("nan")))
    return RetrievalEvaluation(metrics=metrics, result=result, uncertainty=analysis)


def _depths(ks: Sequence[int], use_eccv: bool, image_groups, caption_to_image) -> tuple[int, int]:
    """Top-k depth (i2t, t2i) the scorer keeps: max K, and the largest R of the mAP@R metrics."""
    needs = [{"i2t": max(ks), "t2i": max(ks)}]
    if use_eccv:
        needs.append(eccv.eccv_depth())
    if image_groups is not None:
        needs.append(semantic_depth(image_groups, caption_to_image))
    return max(n["i2t"] for n in needs), max(n["t2i"] for n in needs)


def _want_eccv(requested: bool | None, image_ids, caption_ids) -> bool:
    if requested is False:
        return False
    have_ids = image_ids is not None and caption_ids is not None
    covers = have_ids and eccv.covers_coco_test(image_ids, caption_ids)
    if requested and not covers:
        raise ValueError("ECCV Caption / CxC metrics need COCO ids covering the COCO 5K test set")
    return covers


def evaluate_classification(image_feats: torch.Tensor, class_text_feats: torch.Tensor,
                            head: nn.Module, labels, *, memory_budget_bytes: int = 256 * 2**20,
                            device=None, precision: str = "auto",
                            scorer=None) -> dict[str, float]:
    """Micro accuracy (percent) of the head's top-1 class per image (ties to the lower class index),
    plus the mean sigma_hat of the predicted pair when the head has one."""
    scorer = scorer or ChunkedScorer(head, memory_budget_bytes=memory_budget_bytes, device=device,
                                     precision=precision)
    result = scorer.score(image_feats, class_text_feats, k=1, k_items=1)
    predictions = result.query_topk.indices[:, 0]
    metrics = {"acc": accuracy_from_predictions(predictions, labels),
               "num_samples": float(len(predictions))}
    if result.query_topk.sigma is not None:
        metrics["sigma_top1_mean"] = float(result.query_topk.sigma[:, 0].mean())
    return metrics
