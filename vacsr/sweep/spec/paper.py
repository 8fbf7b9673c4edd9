"""The paper's sweep ingredients, each spelled once: the adapter's search ranges (appendix C.2, E),
the base-to-novel datasets with their batch sizes, the domain shifts and the published averages.
`sweeps/*.py` compose their kinds from these."""
from __future__ import annotations

from vacsr.sweep.spec.space import Choice, Domain, Int, LogFloat

ADAPTER_SPACE: dict[str, Domain] = {
    "loss.alpha_kl": LogFloat(1e-5, 1e-2),
    "loss.beta": LogFloat(0.1, 10.0),
    "loss.gamma": LogFloat(0.1, 10.0),
    "adapter.num_components": Choice((1, 2, 3, 4)),
    "loss.num_hard_negatives": Choice((1, 2, 4, 8)),
    # appendix E.1 says the negatives' variance term "still uses positive labels": searched
    "loss.neg_sigma_target": Choice(("label", "positive")),
}

BACKBONE_SPACE: dict[str, Domain] = {  # MMA's recipe: blocks and epochs searched (C.2)
    "model.trainable_image_blocks": Int(0, 4),  # 0: the adapter and projections alone
    "model.trainable_text_blocks": Int(0, 4),
    # C.2 searches "the number of frozen Transformer layers": frozen below the trainable ones
    # (last) in common use, or above them (first), as C.2's domain generalisation reads
    "model.trainable_side": Choice(("first", "last")),
    "train.epochs": Int(2, 10),
}

# The 11 base-to-novel datasets (CoOp's order) and their searched batch sizes (C.2: 128 for
# SUN397, 5 for EuroSAT, the rest in between).
BASE_TO_NOVEL_BATCH_SIZES: dict[str, tuple[int, ...]] = {
    "imagenet": (64, 128), "caltech101": (16, 32), "oxford_pets": (16, 32),
    "stanford_cars": (16, 32), "oxford_flowers": (16, 32), "food101": (16, 32),
    "fgvc_aircraft": (16, 32), "sun397": (64, 128), "dtd": (16, 32), "eurosat": (4, 5, 6),
    "ucf101": (16, 32),
}

DOMAIN_SHIFTS = ("imagenetv2", "imagenet_sketch", "imagenet_a", "imagenet_r")

# Published rows, shown beside a sweep's table and its comparison: CLIP ViT-B/16 on the real
# datasets, each method with its own tuning, data pipeline and seeds (their papers' numbers, not
# this harness's), as results.md's column title -> value.
PUBLISHED_NOTE = "ViT-B/16, real data, each its own tuning"
# the 11 datasets' averages: the paper's Table 5, and CoOp's from CoCoOp (Zhou et al., CVPR
# 2022, arXiv 2203.05557, Table 1), whose protocol Table 5 follows
PUBLISHED_BASE_TO_NOVEL = {name: dict(zip(("base", "novel", "H"), values)) for name, values in {
    "zero-shot CLIP": (69.34, 74.22, 71.70), "CoOp": (82.69, 63.22, 71.66),
    "CoCoOp": (80.47, 71.69, 75.83), "CLIPOOD": (83.9, 74.5, 78.9),
    "MaPLe": (82.28, 75.14, 78.55), "CoPrompt": (84.00, 77.23, 80.48),
    "MMA": (83.20, 76.80, 79.87), "MMRL": (85.68, 77.16, 81.20),
    "VACSR (paper)": (85.74, 76.08, 80.37),
}.items()}
# ImageNet and its shifts: the paper's Table 4 (ImageNet, V2, Sketch, A, R, their average)
PUBLISHED_DOMAIN_GENERALIZATION = {
    name: dict(zip(("acc", *(f"{s}_acc" for s in DOMAIN_SHIFTS), "ood_avg_acc"), values))
    for name, values in {
        "zero-shot CLIP": (66.7, 60.8, 46.1, 47.8, 74.0, 57.2),
        "CoCoOp": (71.0, 64.1, 48.8, 50.6, 76.2, 59.9),
        "CLIPOOD": (71.6, 64.9, 49.3, 50.4, 77.2, 60.4),
        "MaPLe": (70.7, 64.1, 49.2, 50.9, 77.0, 60.3),
        "CoPrompt": (70.8, 64.3, 49.4, 50.5, 77.5, 60.4),
        "MMA": (71.0, 64.3, 49.1, 51.1, 77.3, 60.5),
        "MMRL": (72.0, 64.5, 49.2, 51.2, 77.5, 60.6),
        "VACSR (paper)": (74.3, 65.7, 49.7, 52.4, 78.4, 61.6),
    }.items()}
