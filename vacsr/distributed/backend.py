"""The torch.distributed setup of a Ray Train run: Ray's documented `TorchConfig`.

Only the choice of process-group backend is ours (vacsr.compute_device.process_group_backend):
NCCL where the workers compute on CUDA, gloo otherwise (gloo has no CUDA collectives, NCCL no CPU
ones).
"""
from __future__ import annotations

from ray.train.torch import TorchConfig

from vacsr.compute_device import process_group_backend


def torch_config(*, gpus_per_worker: float, device: str) -> TorchConfig:
    """TorchConfig for the run's workers; init_method "env" (Ray's)."""
    return TorchConfig(backend=process_group_backend(gpus_per_worker=gpus_per_worker,
                                                     device=device))
