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

# 11-dataset averages (base, novel, H) as published (paper Table 5 and the cited papers).
PUBLISHED_BASE_TO_NOVEL = {
    "zero-shot CLIP": (69.34, 74.22, 71.70), "CoCoOp": (80.47, 71.69, 75.83),
    "MaPLe": (82.28, 75.14, 78.55), "MMA": (83.20, 76.80, 79.87), "MMRL": (85.68, 77.16, 81.20),
    "VACSR (paper)": (85.74, 76.08, 80.37),
}
