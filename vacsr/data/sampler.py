"""Global-batch sharding: W workers see exactly the batches one worker would.

The epoch's permutation is drawn from a generator seeded by the caller (the same on every rank);
global batch s is permutation[s*G:(s+1)*G] and rank r takes its r-th contiguous slice. Gathering
the ranks' features in rank order rebuilds the single-process batch in the same order, so a
distributed step computes the same loss as a local one.

Last-partial-batch policy: dropped. Every step sees a full global batch, so every rank gets an
equal slice and the loss is always taken over G items; the dropped items differ from epoch to
epoch, as the permutation does. A split smaller than one batch therefore yields no step at all,
which `require_one_batch` turns into an error before training starts.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler

from vacsr.errors import ConfigError


class GlobalBatchSampler(Sampler[list[int]]):
    def __init__(self, num_items: int, *, global_batch: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, shuffle: bool = True) -> None:
        if global_batch % world_size:
            raise ValueError(f"global batch {global_batch} is not a multiple of {world_size} ranks")
        self.num_items, self.global_batch = num_items, global_batch
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle = seed, shuffle

    def __len__(self) -> int:
        return self.num_items // self.global_batch  # the last partial batch is dropped

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed)
            order = torch.randperm(self.num_items, generator=generator)
        else:
            order = torch.arange(self.num_items)
        local = self.global_batch // self.world_size
        for step in range(len(self)):
            start = step * self.global_batch + self.rank * local
            yield order[start:start + local].tolist()


def require_one_batch(num_items: int, global_batch: int, *, what: str, remedy: str) -> None:
    """Raise ConfigError when `num_items` fill no full batch: with the partial batch dropped, the
    epoch would have zero steps and "training" would save the initial weights."""
    if num_items >= global_batch:
        return
    smaller = f"set train.batch_size <= {num_items} or " if num_items >= 2 else ""
    raise ConfigError(f"{what}, fewer than one batch of train.batch_size={global_batch} (each "
                      "epoch drops its last partial batch, so no training step would run); "
                      f"{smaller}use {remedy}")
