"""The Ray Train worker side of a run: the vacsr training loop on N workers (DDP).

Each worker builds the same Trainer as a local run. The global batch is sharded by
GlobalBatchSampler; features are all-gathered (with autograd) so the loss sees every pair of the
global batch; gradients are averaged by DDP. Since every rank computes the same global loss, the
all-gather backward hands each rank W copies of its features' gradient and DDP's mean divides them
out again: a W-worker step equals a 1-worker step on the same global batch.

Only Train workers import this module (through `vacsr.distributed.train.train_loop_per_worker`):
it loads the model stack, which the Tune trial actor and the Train controller never need.
"""
from __future__ import annotations

import os
from dataclasses import replace

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch import nn

from vacsr.compute_device import ray_worker_device
from vacsr.config import Config
from vacsr.distributed.fault_injection import maybe_fail_once
from vacsr.distributed.ray_hooks import RayRun
from vacsr.distributed.worker_gpus import record_workers
from vacsr.errors import CheckpointError
from vacsr.records.logger import mlflow_logger
from vacsr.tasks import PairBatch
from vacsr.train.loop import Trainer


def gather_pairs(pairs: PairBatch) -> PairBatch:
    """All ranks' features in rank order; gradients flow back to each rank's own features."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return pairs
    image_feats = _gather_with_grad(pairs.image_feats)
    image_keys = _gather_plain(pairs.image_keys)
    if pairs.text_is_shared:
        text_feats, text_keys = pairs.text_feats, pairs.text_keys
    elif pairs.text_per_image:  # each image's own class set: gathered as the images
        text_feats, text_keys = _gather_with_grad(pairs.text_feats), pairs.text_keys
    else:
        text_feats = _gather_with_grad(pairs.text_feats)
        text_keys = _gather_plain(pairs.text_keys)
    return replace(pairs, image_feats=image_feats, text_feats=text_feats, image_keys=image_keys,
                   text_keys=text_keys)


class _GatherRows(torch.autograd.Function):
    """Every rank's rows in rank order: (B_local, ...) -> (B_global, ...). Backward: the sum
    over the ranks of the gradient of this rank's rows, one all_reduce of the whole gradient.
    torch's autograd all_gather (torch.distributed.nn.functional) emulates that reduce-scatter
    on gloo with scatters into buffers made `empty_like` the incoming gradient: a gradient that
    is not contiguous (an einsum's backward gives CoCoOp's per-image class features a permuted
    one) gets buffers of its strides, which the scatter fills as contiguous, and each rank a
    wrong gradient (torch 2.14). The all_reduce is exact on every backend; these are feature
    tensors, not weights."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        ctx.rank, ctx.rows = dist.get_rank(), tensor.shape[0]
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        total = grad.contiguous().clone()
        dist.all_reduce(total)
        return total[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows]


def _gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """(B_local, ...) -> (B_global, ...); backward sums each rank's gradient back to its owner
    (every rank computes the same global loss, so W times its own: DDP's mean divides it)."""
    return _GatherRows.apply(tensor)


def _gather_plain(tensor: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def check_same_start(start_epoch: int) -> None:
    """Every rank resumes from the same epoch: otherwise DDP pairs the collectives of different
    steps and the ranks wait for each other until the backend's timeout (30 min). A rank that
    could not read the checkpoint ends the run in one line instead."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    starts: list = [None] * dist.get_world_size()
    dist.all_gather_object(starts, start_epoch)
    if len(set(starts)) > 1:
        raise CheckpointError(f"the Train workers restored different epochs from the reported "
                              f"checkpoint (by rank: {starts}); see each worker's log for the "
                              "checkpoint it could not read")


class GlobalLoss(nn.Module):
    """Wraps the model so that DDP sees the whole step (features, gather, loss) in forward."""

    def __init__(self, trainer: Trainer) -> None:
        super().__init__()
        self.model = trainer.model
        self._trainer = [trainer]  # a list keeps the Trainer out of the module tree

    def forward(self, batch, step_seed: int):
        return self._trainer[0].compute_loss(batch, gather_pairs, step_seed)


class RayTrainRun(RayRun):
    """A Ray Train worker's share of a run: every rank reports each epoch to Ray Train (rank 0
    with the checkpoint, Ray Train V2's protocol); DDP over the gathered global batch."""

    def __init__(self, fail_once: str | None = None) -> None:
        context = ray.train.get_context()
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        self.fail_once = fail_once

    def reported_checkpoint(self):
        return ray.train.get_checkpoint()

    def restore(self, trainer: Trainer) -> None:
        super().restore(trainer)
        check_same_start(trainer.start_epoch)

    def send(self, metrics: dict, folder: str | None) -> None:
        checkpoint = None if folder is None else ray.train.Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint)

    def loss_fn(self, trainer: Trainer):
        if trainer.optimizer is None:  # a method that trains nothing: DDP has nothing to sync
            return None
        return ray.train.torch.prepare_model(GlobalLoss(trainer), move_to_device=False)

    def before_epoch(self, epoch: int) -> None:
        # the Train controller collects reports (and checkpoints) by polling the workers every
        # RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s); a crash in a real epoch comes after that
        wait_s = 3 * float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", 2.0))
        maybe_fail_once(self.fail_once, epoch, self.rank, self.world_size, wait_s)

    def after_epoch(self, trainer: Trainer, epoch: int, metrics: dict) -> None:
        self.report(trainer, epoch, metrics)


def train_worker(config: Config, fail_once: str | None = None) -> None:
    """This worker's share of the run: the one training lifecycle with Ray Train's hooks, logged
    to the run's MLflow run where config.tracking asks for one."""
    trainer = Trainer(config, device=ray_worker_device(config.train.device,
                                                       ray.train.torch.get_device()))
    hooks = RayTrainRun(fail_once)
    record_workers(trainer.output_dir, hooks.rank, hooks.world_size, trainer.device)
    trainer.fit(hooks, open_logger=mlflow_logger(config))
