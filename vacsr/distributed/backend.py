"""Ray Train's torch backend, set up without importing torch where no training happens.

`ray.train.torch.TorchConfig` lives in a module that imports torch, and Ray Train unpickles the
backend config in the Tune trial actor and in the Train controller of every run: each of them
paid about 2 CPU-seconds for a torch import it never uses. `LazyTorchConfig` is the same setup
(same worker-side functions, called in the same order as `_TorchBackend`: master address, torch
distributed env vars, `init_process_group`; on shutdown `_shutdown_torch`) from a module that only
the Train workers, which train and import torch anyway, resolve to `ray.train.torch.config`.
"""
from __future__ import annotations

import gc
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass

import ray
from ray.exceptions import GetTimeoutError
from ray.train.backend import Backend, BackendConfig
from ray.train.constants import (DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                 TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
from ray.train._internal.utils import get_address_and_port
from ray.train.v2._internal.util import TrainingFramework

logger = logging.getLogger(__name__)


@contextmanager
def imports_outside_gc():
    """Import a process's big modules with the cyclic garbage collector off, then freeze what
    they loaded out of every later collection. Imports build hundreds of thousands of objects
    and no garbage, yet each collection walks all of them: torch, open_clip and mlflow import
    with a quarter less CPU this way, and opening the MLflow store afterwards (SQLAlchemy
    allocates a lot) takes ~0.1 instead of ~0.9 CPU-s."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # modules, classes and functions live as long as the process anyway
        if enabled:
            gc.enable()


def _on_worker(name: str, **kwargs):
    """Call `ray.train.torch.config.<name>` on a Train worker (the only place torch loads: the
    first call, which sets up the process group, imports it)."""
    with imports_outside_gc():
        from ray.train.torch import config

    return getattr(config, name)(**kwargs)


def _set_master_address(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


class _TorchContext:
    """`TorchConfigContextManager` (sets the worker's CUDA device), resolved on the worker."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        self._inner = TorchConfigContextManager()
        return self._inner.__enter__()

    def __exit__(self, *exc_info):
        return self._inner.__exit__(*exc_info)


class _LazyTorchBackend(Backend):
    """`_TorchBackend` for Ray Train V2 worker groups with init_method "env"."""

    share_cuda_visible_devices: bool = True  # as torch's: NCCL peers see each other's GPUs

    def on_start(self, worker_group, backend_config: LazyTorchConfig) -> None:
        addr, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_set_master_address, addr=addr, port=port)
        worker_group.execute(_on_worker, "_set_torch_distributed_env_vars")
        ray.get([worker_group.execute_single_async(
            rank, _on_worker, "_setup_torch_process_group", backend=backend_config.backend,
            world_rank=rank, world_size=len(worker_group), init_method="env://",
            timeout_s=backend_config.timeout_s) for rank in range(len(worker_group))])

    def on_shutdown(self, worker_group, backend_config: LazyTorchConfig) -> None:
        futures = worker_group.execute_async(_on_worker, "_shutdown_torch",
                                             destroy_process_group=len(worker_group) > 1)
        timeout_s = int(os.environ.get(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                       DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S))
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            logger.warning(f"Torch process group shutdown timed out after {timeout_s} seconds")


@dataclass
class LazyTorchConfig(BackendConfig):
    """`TorchConfig(backend=...)` with init_method "env", importable without torch."""

    backend: str = "gloo"  # "gloo" (CPU workers) or "nccl" (GPU workers)
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return _LazyTorchBackend

    @property
    def train_func_context(self):
        return _TorchContext

    @property
    def framework(self):
        return TrainingFramework.TORCH

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}
