"""Uncertainty analysis of paper Fig. 3 (sec. 4.4).

Per query, the sigma_hat of its top-1 item is the confidence of that retrieval. Queries are split
into equal-width sigma_hat bins (10 by default, over the observed range), R@1 is computed per bin,
and the Pearson correlation between bin centre and bin R@1 summarises the relation (the paper
reports -0.931 i2t and -0.903 t2i). The per-query correlation between sigma_hat and top-1
correctness is reported too.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from vacsr.eval.metrics import Positives
from vacsr.eval.scorer import ScoreResult


def pearson(x, y) -> float:
    """Pearson correlation of two 1-D sequences; nan when either is constant or too short."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def binned_recall(sigma, correct, num_bins: int = 10, value_range=None) -> dict:
    """sigma (N,) top-1 sigma_hat, correct (N,) bool -> per-bin count and R@1 (percent, nan if
    empty).

    Bins are equal-width over value_range (default: observed min..max), the last one closed.
    """
    sigma = np.asarray(sigma, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    keep = np.isfinite(sigma)
    sigma, correct = sigma[keep], correct[keep]
    low, high = value_range if value_range is not None else (sigma.min(), sigma.max())
    edges = np.linspace(low, high, num_bins + 1)
    width = (high - low) or 1.0
    index = np.clip(np.floor((sigma - low) / width * num_bins).astype(int), 0, num_bins - 1)
    counts = np.bincount(index, minlength=num_bins)
    hits = np.bincount(index, weights=correct.astype(np.float64), minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = np.where(counts > 0, 100.0 * hits / np.maximum(counts, 1), np.nan)
    centers = (edges[:-1] + edges[1:]) / 2
    filled = counts > 0
    return {"edges": edges.tolist(), "centers": centers.tolist(), "counts": counts.tolist(),
            "r1": recall.tolist(), "pearson_bins": pearson(centers[filled], recall[filled]),
            "pearson_queries": pearson(sigma, correct.astype(np.float64)),
            "r1_overall": 100.0 * float(correct.mean()) if len(correct) else math.nan}


def uncertainty_analysis(result: ScoreResult, caption_to_image, num_bins: int = 10) -> dict:
    """Fig. 3 for both retrieval directions from a scorer result (needs a head with sigma_hat)."""
    if result.query_topk.sigma is None:
        raise ValueError("this head returns no sigma_hat; the uncertainty analysis needs one")
    caption_to_image = torch.as_tensor(np.asarray(caption_to_image), dtype=torch.long)
    num_images = result.query_topk.indices.shape[0]
    i2t_top1 = result.query_topk.indices[:, :1]
    i2t_correct = Positives.from_assignment(caption_to_image, num_images).relevance(i2t_top1)[:, 0]
    t2i_top1 = result.item_topk.indices[:, 0]
    t2i_correct = t2i_top1 == caption_to_image
    return {"i2t": binned_recall(result.query_topk.sigma[:, 0], i2t_correct, num_bins),
            "t2i": binned_recall(result.item_topk.sigma[:, 0], t2i_correct, num_bins)}


def plot_uncertainty(analysis: dict, path) -> Path:
    """Bar plot of R@1 per sigma_hat bin, one panel per direction, Pearson r in the title -> PNG."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on workers or CI
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(analysis), figsize=(5 * len(analysis), 3.6), squeeze=False)
    for ax, (direction, bins) in zip(axes[0], analysis.items()):
        width = (bins["edges"][1] - bins["edges"][0]) * 0.9 if len(bins["edges"]) > 1 else 0.1
        recall = [0.0 if math.isnan(r) else r for r in bins["r1"]]
        ax.bar(bins["centers"], recall, width=width or 0.1, color="tab:blue", edgecolor="black")
        ax.set_xlabel("uncertainty $\\hat\\sigma$ of the top-1 item")
        ax.set_ylabel("R@1 (%)")
        ax.set_title(f"{direction}: r = {bins['pearson_bins']:.3f}")
        ax.set_ylim(0, 100)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
