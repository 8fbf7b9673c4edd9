"""A run of one worker trained in a Ray actor that already holds a worker's resources: a sweep's
final seed run in its first evaluation actor (vacsr/distributed/eval_actor.py), which then
encodes and scores the checkpoint in the same process.

A TorchTrainer for one worker starts four processes (Ray Train's controller, its worker and two
helper actors: benchmarks/bench_startup.py) that distribute nothing, and the evaluation actors
it had to give way to start again after it. Here the run computes where a Train worker would
(the actor's GPU, or the CPU), checkpoints every epoch into its output folder, and a new attempt
(a lost actor retried by the caller, or a `--resume` of the sweep) continues from that checkpoint,
as Ray Train restarts a run from its last reported one. A run's own error (a VacsrError: bad
data, a diverged loss) is recorded in FAILED_FILE for the caller to raise, as on Ray Train.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vacsr.distributed.fault_injection import maybe_fail_once
from vacsr.distributed.ray_hooks import read_or_restart
from vacsr.distributed.worker_gpus import assigned_device, placement_tags, record_workers
from vacsr.errors import VacsrError
from vacsr.train.checkpoint import load_checkpoint
from vacsr.train.failure import clear_run_failure, record_run_failure
from vacsr.train.run_hooks import RunHooks

if TYPE_CHECKING:
    from vacsr.config import Config
    from vacsr.train.loop import Trainer


class ActorRun(RunHooks):
    """A one-worker run in an actor: it resumes from the checkpoint an earlier attempt left in
    its output folder (the epochs after it are those a run without the stop computes: runs are
    seeded), checkpoints there every epoch, and continues its MLflow run when restarted."""

    marks_resume = True  # a run restarted from a checkpoint says so in the history, as on Train

    def __init__(self, fail_once: str | None = None) -> None:
        self.fail_once = fail_once  # the resilience tests' switch (fault_injection.py)

    def before_epoch(self, epoch: int) -> None:
        maybe_fail_once(self.fail_once, epoch)

    def restore(self, trainer: Trainer) -> None:
        path = trainer.checkpoint_path
        if not path.is_file():  # a first attempt
            return
        state = read_or_restart(lambda: load_checkpoint(path, trainer.device))
        if state is not None:
            trainer.load_state(state, source=path)

    def tracking_resume(self, trainer: Trainer) -> bool:
        return trainer.start_epoch > 0  # a restarted run continues its MLflow run

    def tracking_tags(self) -> dict:
        return placement_tags()


def fit_in_actor(config: Config, fail_once: str | None = None) -> tuple[str, tuple[str, ...]]:
    """Train `config`'s run (one worker) in this actor; (its final checkpoint, the prefix
    cache's lines on damaged files it rebuilt)."""
    import torch

    from vacsr.compute_device import ray_worker_device
    from vacsr.records.logger import mlflow_logger
    from vacsr.train.loop import Trainer

    output_dir = Path(config.train.output_dir)
    clear_run_failure(output_dir)
    try:
        # train.device=cpu keeps the tensors on the CPU with a GPU reserved (logical GPUs)
        device = ray_worker_device(config.train.device, torch.device(assigned_device()))
        trainer = Trainer(config, device=device)
        record_workers(trainer.output_dir, 0, 1, device, ray_device=assigned_device())
        result = trainer.fit(ActorRun(fail_once), open_logger=mlflow_logger(config))
    except VacsrError as exc:
        record_run_failure(output_dir, exc)
        raise
    rebuilt = trainer.prefix_cache.stats.rebuilt if trainer.prefix_cache is not None else []
    return str(result.checkpoint), tuple(rebuilt)
