"""Ray Train: the vacsr training loop on N workers (DDP), resumable and failure-tolerant.

Each worker builds the same Trainer as a local run. The global batch is sharded by
GlobalBatchSampler; features are all-gathered (with autograd) so the loss sees every pair of the
global batch; gradients are averaged by DDP. Since every rank computes the same global loss, the
all-gather backward hands each rank W copies of its features' gradient and DDP's mean divides them
out again: a W-worker step equals a 1-worker step on the same global batch.
"""
from __future__ import annotations

import os
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn

from vacsr.config import Config, from_dict, save_config, to_dict
from vacsr.train.checkpoint import load_checkpoint, save_checkpoint

if TYPE_CHECKING:  # the model stack (open_clip, timm, torchvision) loads only on training workers:
    # Tune trial actors and Train controllers import this module too, and pay for every import
    from vacsr.tasks import PairBatch
    from vacsr.train.loop import Trainer, TrainResult

CHECKPOINT_FILE = "last.ckpt"


def gather_pairs(pairs: PairBatch) -> PairBatch:
    """All ranks' features in rank order; gradients flow back to each rank's own features."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return pairs
    image_feats = _gather_with_grad(pairs.image_feats)
    image_keys = _gather_plain(pairs.image_keys)
    if pairs.text_is_shared:
        text_feats, text_keys = pairs.text_feats, pairs.text_keys
    else:
        text_feats = _gather_with_grad(pairs.text_feats)
        text_keys = _gather_plain(pairs.text_keys)
    return replace(pairs, image_feats=image_feats, text_feats=text_feats, image_keys=image_keys,
                   text_keys=text_keys)


def _gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """(B_local, d) -> (B_global, d); backward sums each rank's gradient back to its owner."""
    with warnings.catch_warnings():  # the autograd all_gather is public API, marked deprecated
        warnings.simplefilter("ignore", FutureWarning)
        return torch.cat(dist_fn.all_gather(tensor))


def _gather_plain(tensor: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


class GlobalLoss(nn.Module):
    """Wraps the model so that DDP sees the whole step (features, gather, loss) in forward."""

    def __init__(self, trainer: Trainer) -> None:
        super().__init__()
        self.model = trainer.model
        self._trainer = [trainer]  # a list keeps the Trainer out of the module tree

    def forward(self, batch, step_seed: int):
        return self._trainer[0].compute_loss(batch, gather_pairs, step_seed)


def _maybe_inject_failure(epoch: int, rank: int, world: int) -> None:
    """Fault injection for resilience tests: VACSR_FAIL_ONCE=<epoch>:<marker file> kills the last
    rank's worker process as it starts that (0-based) epoch, once (the marker records it)."""
    spec = os.environ.get("VACSR_FAIL_ONCE")
    if not spec or rank != world - 1:
        return
    fail_epoch, marker = spec.split(":", 1)
    if epoch == int(fail_epoch) and not Path(marker).exists():
        Path(marker).write_text(f"killed at the start of epoch {epoch + 1}\n")
        # the Train controller collects reports (and checkpoints) by polling the workers every
        # RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s); wait for it, as a crash in a real epoch would
        time.sleep(3 * float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", 2.0)))
        os._exit(1)  # an abrupt worker death, not a Python exception


def _restore(trainer: Trainer) -> None:
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return
    with checkpoint.as_directory() as folder:
        trainer.load_state(load_checkpoint(Path(folder) / CHECKPOINT_FILE, trainer.device))


def _report(trainer: Trainer, epoch: int, metrics: dict, rank: int) -> None:
    """Every rank reports; rank 0 attaches the checkpoint (Ray Train V2 protocol)."""
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if rank == 0:
            save_checkpoint(Path(folder) / CHECKPOINT_FILE, trainer.state(epoch))
            checkpoint = ray.train.Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint)


def train_loop_per_worker(loop_config: dict) -> None:
    """Runs on every Ray Train worker: build, resume, train the remaining epochs, report."""
    from vacsr.train.loop import Trainer, TrainResult, write_json

    config = from_dict(loop_config["config"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    trainer = Trainer(config, device=ray.train.torch.get_device())
    _restore(trainer)
    resumed_from = trainer.start_epoch
    loss_module = ray.train.torch.prepare_model(GlobalLoss(trainer), move_to_device=False)
    tracker = None
    if rank == 0:
        trainer.output_dir.mkdir(parents=True, exist_ok=True)
        save_config(config, trainer.output_dir / "config.yaml")
        tracker = _start_tracking(config, trainer)
    dataset = trainer.train_dataset()
    for epoch in range(trainer.start_epoch, config.train.epochs):
        _maybe_inject_failure(epoch, rank, world)
        loader = trainer.train_loader(epoch, dataset, rank=rank, world_size=world)
        metrics = {"epoch": epoch + 1, **trainer.train_epoch(
            epoch, loader, loss_fn=loss_module, show_progress=rank == 0)}
        if resumed_from:
            metrics["resumed_from_epoch"] = resumed_from  # visible in the history and MLflow
        if rank == 0:
            for split in trainer.eval_splits(epoch):
                metrics.update({f"{split}/{k}": v for k, v in trainer.evaluate(split).items()})
            trainer.history.append(metrics)
        _report(trainer, epoch, metrics, rank)
        if tracker is not None:
            tracker(epoch, metrics, None)
    if resumed_from >= config.train.epochs and trainer.history:
        # restarted after its last epoch (a Tune trial resumed by a new driver): report the final
        # result again, or the Tune trial ends without its metric
        _report(trainer, resumed_from - 1, dict(trainer.history[-1]), rank)
    if rank == 0:
        final = trainer.history[-1] if trainer.history else {}
        write_json(trainer.output_dir / "metrics.json", {"final": final, "history": trainer.history})
        if tracker is not None:
            tracker.finish(TrainResult(trainer.history, final, None), trainer.output_dir)


def _start_tracking(config: Config, trainer: Trainer):
    """Rank 0's MLflow callback; a worker restarted from a checkpoint continues the same run."""
    if not config.tracking.enabled:
        return None
    from vacsr.tracking import TrackingCallback

    return TrackingCallback.start(config, experiment=config.tracking.experiment,
                                  run_name=config.tracking.run_name,
                                  tracking_uri=config.tracking.uri,
                                  parent_run_id=config.tracking.parent_run_id,
                                  resume=trainer.start_epoch > 0 or config.train.resume,
                                  tags=_placement_tags())


def _placement_tags() -> dict:
    """Where rank 0 ran (Ray node id and host): which machine trained a run, in MLflow."""
    import socket

    context = ray.get_runtime_context()
    return {"vacsr.ray_node_id": context.get_node_id(), "vacsr.host": socket.gethostname()}


def _worker_env() -> dict | None:
    """Pass the fault-injection switch (tests) on to the workers when the driver has it."""
    spec = os.environ.get("VACSR_FAIL_ONCE")
    return {"env_vars": {"VACSR_FAIL_ONCE": spec}} if spec else None


def build_torch_trainer(config: Config, *, name: str | None = None,
                        callbacks: list | None = None) -> ray.train.torch.TorchTrainer:
    """A TorchTrainer for `config` (paths made absolute: Ray workers start elsewhere)."""
    output_dir = Path(config.train.output_dir).expanduser().resolve()
    config.train.output_dir = str(output_dir)
    storage = config.train.storage_path or str(output_dir / "ray")
    use_gpu = config.train.gpus_per_worker > 0
    resources = {"CPU": config.train.cpus_per_worker}
    if use_gpu:
        resources["GPU"] = config.train.gpus_per_worker
    return ray.train.torch.TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": to_dict(config)},
        scaling_config=ray.train.ScalingConfig(num_workers=config.train.workers, use_gpu=use_gpu,
                                               resources_per_worker=resources),
        torch_config=ray.train.torch.TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=name or output_dir.name, storage_path=storage, callbacks=callbacks,
            failure_config=ray.train.FailureConfig(max_failures=config.train.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            worker_runtime_env=_worker_env()),
    )


def result_from_checkpoint(checkpoint, output_dir: Path) -> TrainResult:
    """Copy the run's final checkpoint to output_dir/last.ckpt and read its history."""
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
    return result_from_checkpoint(result.checkpoint, Path(config.train.output_dir))
