"""Seeding of python, numpy and torch (every run is seeded: runs repeat exactly)."""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int) -> int:
    """Each epoch reseeds from (run seed, epoch), so a resumed run replays the same epochs."""
    return seed * 100_003 + epoch
