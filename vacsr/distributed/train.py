"""Ray Train: the vacsr training loop on N workers (DDP), resumable and failure-tolerant.

This module is the driver side of a run, and imports neither torch nor the model stack: the Tune
trial actor and the Train controller of every run load it (the trainer, the backend config and the
worker entry point are unpickled there), and each paid about 2 CPU-seconds for a torch import.
The training itself lives in `vacsr.distributed.worker`, which only the Train workers import.
"""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import ray
import ray.train
from ray.train.v2._internal.callbacks import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
from ray.train.v2._internal.execution.controller import TrainController
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from vacsr.atomic import atomic_write_json
from vacsr.config import Config, from_dict, to_dict
from vacsr.device import process_group_backend
from vacsr.distributed.backend import LazyTorchConfig, imports_outside_gc
from vacsr.distributed.placement import SharedCleanerCallback, find_cleaner

if TYPE_CHECKING:
    from vacsr.train.loop import TrainResult

CHECKPOINT_FILE = "last.ckpt"
FAILED_FILE = "failed.json"  # in a run's output folder: the error that ended it, one line


def train_loop_per_worker(loop_config: dict) -> None:
    """Runs on every Ray Train worker. An error of the run itself (a VacsrError: bad data, a
    diverged loss) is deterministic: it is recorded in FAILED_FILE and the worker returns, so Ray
    Train does not retry it (its retries are for lost workers); the caller raises it."""
    config = from_dict(loop_config["config"])
    with imports_outside_gc():  # the model stack, and MLflow where the run logs to it
        from vacsr.distributed.worker import train_worker
        from vacsr.errors import VacsrError

        if config.tracking.enabled:
            import vacsr.tracking  # noqa: F401
    output_dir = Path(config.train.output_dir)
    (output_dir / FAILED_FILE).unlink(missing_ok=True)
    try:
        train_worker(config)
    except VacsrError as exc:
        if ray.train.get_context().get_world_rank() == 0:
            atomic_write_json(output_dir / FAILED_FILE, {"error": str(exc),
                                                         "type": type(exc).__name__})


def raise_if_run_failed(output_dir: str | Path) -> None:
    """Raise the error a run recorded in FAILED_FILE (one line), if any."""
    path = Path(output_dir) / FAILED_FILE
    if path.is_file():
        from vacsr.errors import RunFailed

        raise RunFailed(json.loads(path.read_text())["error"])


class LeanTorchTrainer(DataParallelTrainer):
    """Ray Train's TorchTrainer for our runs, with the per-run processes that do not train left
    out (each a Python process of its own, ~1.5 CPU-s to start; a small dataset's trial trains for
    little more than that on a GPU):
    - the backend is LazyTorchConfig: torch loads on the workers only;
    - when `fit()` runs in an actor (a Tune trial), the Train controller runs there too instead of
      in an actor of its own: it only schedules and polls the workers, and killing the trial actor
      still ends them (they are its own). On a driver (`vacsr train --ray`) Ray's controller
      actor stays: the workers' context needs a controller actor handle;
    - a trial's placement group is registered with the sweep's shared cleaner (placement.py)
      instead of a cleaner actor per run, where a sweep driver started one;
    - without Ray Datasets (the workers load their data themselves), Ray Train's datasets callback
      would still start a DatasetManager actor that serves no dataset: it is dropped.
    """

    def _create_default_callbacks(self) -> list:
        callbacks = super()._create_default_callbacks()
        owner_id = ray.get_runtime_context().get_actor_id()  # None on a driver
        cleaner = find_cleaner() if owner_id is not None else None
        lean = []
        for callback in callbacks:
            if isinstance(callback, DatasetsCallback) and not self.datasets:
                continue
            if isinstance(callback, PlacementGroupCleanerCallback) and cleaner is not None:
                callback = SharedCleanerCallback(cleaner, owner_id)
            lean.append(callback)
        return lean

    def _initialize_and_run_controller(self, **controller_init_kwargs):
        if ray.get_runtime_context().get_actor_id() is None:
            return super()._initialize_and_run_controller(**controller_init_kwargs)
        controller = TrainController(**controller_init_kwargs)
        asyncio.run(controller.run())
        return controller.get_result()


def _worker_env() -> dict | None:
    """Pass the fault-injection switch (tests) on to the workers when the driver has it."""
    spec = os.environ.get("VACSR_FAIL_ONCE")
    return {"env_vars": {"VACSR_FAIL_ONCE": spec}} if spec else None


def build_torch_trainer(config: Config, *, name: str | None = None,
                        callbacks: list | None = None) -> LeanTorchTrainer:
    """A TorchTrainer for `config` (paths made absolute: Ray workers start elsewhere)."""
    output_dir = Path(config.train.output_dir).expanduser().resolve()
    config.train.output_dir = str(output_dir)
    storage = config.train.storage_path or str(output_dir / "ray")
    use_gpu = config.train.gpus_per_worker > 0
    resources = {"CPU": config.train.cpus_per_worker}
    if use_gpu:
        resources["GPU"] = config.train.gpus_per_worker
    return LeanTorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": to_dict(config)},
        scaling_config=ray.train.ScalingConfig(num_workers=config.train.workers, use_gpu=use_gpu,
                                               resources_per_worker=resources),
        backend_config=LazyTorchConfig(backend=process_group_backend(
            gpus_per_worker=config.train.gpus_per_worker, device=config.train.device)),
        run_config=ray.train.RunConfig(
            name=name or output_dir.name, storage_path=storage, callbacks=callbacks,
            failure_config=ray.train.FailureConfig(max_failures=config.train.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            worker_runtime_env=_worker_env()),
    )


def result_from_checkpoint(checkpoint, output_dir: Path) -> TrainResult:
    """Copy the run's final checkpoint to output_dir/last.ckpt and read its history."""
    from vacsr.train.checkpoint import load_checkpoint, save_checkpoint
    from vacsr.train.loop import TrainResult

    with checkpoint.as_directory() as folder:
        state = load_checkpoint(Path(folder) / CHECKPOINT_FILE)
    save_checkpoint(output_dir / CHECKPOINT_FILE, state)
    history = list(state["history"])
    return TrainResult(history=history, final_metrics=history[-1] if history else {},
                       checkpoint=output_dir / CHECKPOINT_FILE)


def fit_ray(config: Config, name: str | None = None) -> TrainResult:
    """Driver side: a TorchTrainer over `config.train.workers` workers; returns the final result.
    `name` (default: the output folder's name) identifies the run in Ray Train's storage: a run
    started again under the same name and storage resumes from its last checkpoint."""
    from vacsr.distributed.cluster import ensure_ray

    ensure_ray()
    result = build_torch_trainer(config, name=name).fit()
    raise_if_run_failed(config.train.output_dir)
    return result_from_checkpoint(result.checkpoint, Path(config.train.output_dir))
