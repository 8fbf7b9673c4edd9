"""The Ray Train worker side of a run: the vacsr training loop on N workers (DDP).

Each worker builds the same Trainer as a local run. The global batch is sharded by
GlobalBatchSampler; features are all-gathered (with autograd) so the loss sees every pair of the
global batch; gradients are averaged by DDP. Since every rank computes the same global loss, the
all-gather backward hands each rank W copies of its features' gradient and DDP's mean divides them
out again: a W-worker step equals a 1-worker step on the same global batch.

Only Train workers import this module (through `vacsr.distributed.train.train_loop_per_worker`):
it loads torch and the model stack, which the Tune trial actor and the Train controller never need.
"""
from __future__ import annotations

import os
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn

from vacsr.config import Config, save_config
from vacsr.device import ray_worker_device
from vacsr.distributed.devices import record_workers
from vacsr.distributed.train import CHECKPOINT_FILE
from vacsr.tasks import PairBatch
from vacsr.train.checkpoint import load_checkpoint, save_checkpoint
from vacsr.train.loop import Trainer, TrainResult, write_json


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


def train_worker(config: Config) -> None:
    """Build, resume, train the remaining epochs, report."""
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    trainer = Trainer(config, device=ray_worker_device(config.train.device,
                                                       ray.train.torch.get_device()))
    record_workers(trainer.output_dir, rank, world, trainer.device)
    _restore(trainer)
    loss_module = ray.train.torch.prepare_model(GlobalLoss(trainer), move_to_device=False)
    tracker = None
    if rank == 0:
        trainer.output_dir.mkdir(parents=True, exist_ok=True)
        save_config(config, trainer.output_dir / "config.yaml")
        tracker = _start_tracking(config, trainer)
    try:
        _epochs(config, trainer, loss_module, tracker, rank, world)
    except BaseException:
        if tracker is not None:
            tracker.fail("FAILED")  # the trial's MLflow run: FAILED, not left RUNNING
        raise
    if rank == 0:
        final = trainer.history[-1] if trainer.history else {}
        write_json(trainer.output_dir / "metrics.json", {"final": final, "history": trainer.history})
        if tracker is not None:
            tracker.finish(TrainResult(trainer.history, final, None), trainer.output_dir)


def _epochs(config: Config, trainer: Trainer, loss_module, tracker, rank: int,
            world: int) -> None:
    resumed_from = trainer.start_epoch
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
