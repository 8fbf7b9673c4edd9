"""DataLoader construction that keeps a GPU fed and stays reproducible.

Workers decode and transform images in parallel (persistent across epochs, with prefetching),
batches are pinned when they go to CUDA so host-to-device copies overlap compute, the shuffle order
comes from a seeded generator, and each worker seeds python/numpy from torch's per-worker seed so
random augmentations do not repeat across workers. Errors raised in a worker reach the caller as
the original one-line vacsr error instead of a worker traceback.
"""
from __future__ import annotations

import random
from typing import Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from vacsr.data.datasets import ImageDataset
from vacsr.errors import VacsrError


def seed_worker(worker_id: int) -> None:
    """worker_init_fn: torch already gives worker i the seed base + i; share it with python and
    numpy, whose state would otherwise be a copy of the parent's in every worker."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def _one_line(error: VacsrError) -> VacsrError:
    """torch re-raises a worker's exception with the worker traceback in its message; keep the
    original message (the last line of that traceback)."""
    text = str(error)
    if "Traceback" not in text:
        return error
    last = [line for line in text.splitlines() if line.strip()][-1]
    _, sep, message = last.partition(f"{type(error).__name__}: ")
    return type(error)(message if sep else last)


class CleanErrorDataLoader(DataLoader):
    """A DataLoader whose iteration re-raises vacsr errors from workers as one line."""

    def __iter__(self) -> Iterator:
        iterator = super().__iter__()
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except VacsrError as error:
                raise _one_line(error) from None
            yield batch


def wants_pinning(device: str | torch.device | None) -> bool:
    if device is None:
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda"


def make_loader(dataset: Dataset, *, batch_size: int, shuffle: bool = False, seed: int = 0,
                num_workers: int = 0, device: str | torch.device | None = None,
                drop_last: bool = False, collate_fn: Callable | None = None,
                sampler: Sampler | None = None, batch_sampler: Sampler | None = None,
                prefetch_factor: int = 4) -> DataLoader:
    """A seeded DataLoader: workers persist and prefetch, memory is pinned for CUDA targets.
    With `batch_sampler`, it alone decides the batches (batch size, shuffle, drop_last unused)."""
    generator = torch.Generator().manual_seed(seed)
    extra = {}
    if num_workers > 0:
        extra = {"persistent_workers": True, "prefetch_factor": prefetch_factor,
                 "worker_init_fn": seed_worker}
    if batch_sampler is not None:
        return CleanErrorDataLoader(dataset, batch_sampler=batch_sampler, num_workers=num_workers,
                                    pin_memory=wants_pinning(device), collate_fn=collate_fn,
                                    **extra)
    return CleanErrorDataLoader(
        dataset, batch_size=batch_size, shuffle=shuffle if sampler is None else False,
        sampler=sampler, num_workers=num_workers, pin_memory=wants_pinning(device),
        drop_last=drop_last, collate_fn=collate_fn, generator=generator, **extra)


def image_loader(images, transform: Callable, *, batch_size: int, num_workers: int = 0,
                 device: str | torch.device | None = None) -> DataLoader:
    """(images, indices) batches in order, for evaluation and feature caching."""
    return make_loader(ImageDataset(images, transform), batch_size=batch_size,
                       num_workers=num_workers, device=device)
