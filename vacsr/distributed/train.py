"""Ray Train: the vacsr training loop on N workers (DDP), resumable and failure-tolerant.

The driver side of a run, on Ray Train's documented API: a `ray.train.torch.TorchTrainer` with
`TorchConfig`, `ScalingConfig` and a `RunConfig` whose `FailureConfig` restarts lost workers from
the last reported checkpoint. The worker side is `vacsr.distributed.worker`.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from pathlib import Path

import ray
import ray.train
from ray.train.torch import TorchTrainer

from vacsr.config import Config, from_dict, to_dict
from vacsr.distributed.backend import torch_config
from vacsr.distributed.fault_injection import fail_once_spec
from vacsr.distributed.storage_fs import ray_storage
from vacsr.results import PREFIX_CACHE_REBUILT
from vacsr.train.failure import clear_run_failure, raise_if_run_failed, record_run_failure
from vacsr.train.run_files import CHECKPOINT_FILE
from vacsr.train.run_result import TrainResult


@contextmanager
def imports_outside_gc():
    """Import big modules with the cyclic garbage collector off, then freeze what they loaded out
    of every later collection: imports build hundreds of thousands of objects and no garbage, yet
    each collection walks all of them (the model stack and mlflow import with a quarter less CPU
    this way)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # modules, classes and functions live as long as the process anyway
        if enabled:
            gc.enable()


def train_loop_per_worker(loop_config: dict) -> None:
    """Runs on every Ray Train worker. An error of the run itself (a VacsrError: bad data, a
    diverged loss) is deterministic: it is recorded in FAILED_FILE and the worker returns, so Ray
    Train does not retry it (its retries are for lost workers); the caller raises it. The worker
    module loads here, on the workers: the trainer's driver side needs none of the model stack."""
    config = from_dict(loop_config["config"])
    with imports_outside_gc():
        from vacsr.distributed.worker import train_worker
        from vacsr.errors import VacsrError

        if config.tracking.enabled:
            import vacsr.records  # noqa: F401  (mlflow)
    output_dir = Path(config.train.output_dir)
    clear_run_failure(output_dir)
    try:
        train_worker(config, fail_once=loop_config.get("fail_once"))
    except VacsrError as exc:
        if ray.train.get_context().get_world_rank() == 0:
            record_run_failure(output_dir, exc)


def build_torch_trainer(config: Config, *, name: str | None = None,
                        callbacks: list | None = None) -> TorchTrainer:
    """A TorchTrainer for `config` (paths made absolute: Ray workers start elsewhere)."""
    output_dir = Path(config.train.output_dir).expanduser().resolve()
    config.train.output_dir = str(output_dir)
    # a local folder gets whole-file writes: a full disk cannot truncate Ray's state files
    storage, filesystem = ray_storage(config.train.storage_path or str(output_dir / "ray"))
    use_gpu = config.train.gpus_per_worker > 0
    resources = {"CPU": config.train.cpus_per_worker}
    if use_gpu:
        resources["GPU"] = config.train.gpus_per_worker
    return TorchTrainer(
        train_loop_per_worker,
        # the fault-injection switch of the resilience tests travels with the config
        train_loop_config={"config": to_dict(config),
                           "fail_once": fail_once_spec()},
        torch_config=torch_config(gpus_per_worker=config.train.gpus_per_worker,
                                  device=config.train.device),
        scaling_config=ray.train.ScalingConfig(num_workers=config.train.workers, use_gpu=use_gpu,
                                               resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=name or output_dir.name, storage_path=storage, storage_filesystem=filesystem,
            callbacks=callbacks,
            failure_config=ray.train.FailureConfig(max_failures=config.train.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2)),
    )


def result_from_checkpoint(checkpoint, output_dir: Path) -> TrainResult:
    """Copy the run's final checkpoint to output_dir/CHECKPOINT_FILE and read its history."""
    from vacsr.distributed.ray_hooks import read_reported
    from vacsr.train.checkpoint import save_checkpoint

    state = read_reported(checkpoint, output_dir)
    save_checkpoint(output_dir / CHECKPOINT_FILE, state)
    return TrainResult.of_history(list(state["history"]), output_dir / CHECKPOINT_FILE)


def fit_ray(config: Config, name: str | None = None) -> TrainResult:
    """Driver side: a TorchTrainer over `config.train.workers` workers; returns the final result.
    `name` (default: the output folder's name) identifies the run in Ray Train's storage: a run
    started again under the same name and storage resumes from its last checkpoint."""
    from vacsr.distributed.cluster import ensure_ray

    ensure_ray()
    result = build_torch_trainer(config, name=name).fit()
    raise_if_run_failed(config.train.output_dir)
    trained = result_from_checkpoint(result.checkpoint, Path(config.train.output_dir))
    # the prefix cache's lines on damaged files it rebuilt: in the workers' logs, not here
    trained.notes = tuple(str((result.metrics or {}).get(PREFIX_CACHE_REBUILT) or "")
                          .splitlines())
    return trained
