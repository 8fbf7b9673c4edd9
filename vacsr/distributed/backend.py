"""The torch.distributed setup of a Ray Train run: Ray's documented `TorchConfig`.

Only the choice of process-group backend is ours: NCCL where the workers hold GPUs, gloo on CPU
workers (gloo has no CUDA collectives, NCCL no CPU ones).
"""
from __future__ import annotations

from ray.train.torch import TorchConfig


def process_group_backend(use_gpu: bool) -> str:
    return "nccl" if use_gpu else "gloo"


def torch_config(use_gpu: bool) -> TorchConfig:
    """TorchConfig for workers with (`use_gpu`) or without GPUs; init_method "env" (Ray's)."""
    return TorchConfig(backend=process_group_backend(use_gpu))
