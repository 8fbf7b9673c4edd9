"""What differs between the places one training run runs in: `Trainer.fit` is the lifecycle
(config saved, epochs, evaluation, history, checkpoint, metrics.json, the run's logger), a
RunHooks the place. `LocalRun` is a run in this process; `vacsr.distributed.worker.RayTrainRun` a
Ray Train worker's share of a run (a `vacsr train --ray` run, a sweep's final run, or a Tune trial
of several workers, whose reports its TuneReportCallback passes on to Tune);
`vacsr.sweep.search.trial_run.TuneTrialRun` a one-worker Tune trial training in its trial actor
(both on the Ray base of vacsr/distributed/ray_hooks.py).

The run's metrics logger (MLflow: `vacsr.records.TrackingCallback`) is handed to `Trainer.fit` by
its caller as an `OpenLogger`; this package never imports the tracking code.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

from vacsr.train.checkpoint import save_checkpoint
from vacsr.train.run_result import TrainResult


class RunTrainer(Protocol):
    """What these hooks use of the run's `vacsr.train.loop.Trainer` (which imports this module,
    so it is described here rather than imported)."""

    run_tags: dict[str, Any]  # the run's MLflow tags

    @property
    def checkpoint_path(self) -> Path: ...

    def state(self, epoch: int) -> dict: ...

    def maybe_resume(self) -> bool: ...


class RunLogger(Protocol):
    """A run's metrics logger: called after every logged epoch, then finished or failed once."""

    def __call__(self, epoch: int, metrics: dict, checkpoint: Path | None) -> None: ...

    def finish(self, result: TrainResult, output_dir: str | Path | None = None) -> None: ...

    def fail(self, status: str = "FAILED") -> None: ...


class OpenLogger(Protocol):
    """Opens the run's logger once the run's state is restored: `resume` says whether the run
    continues one (None: config.train.resume), `tags` where it runs. `functools.partial(
    TrackingCallback.from_config, config)` is one."""

    def __call__(self, *, resume: bool | None, tags: dict[str, Any]) -> RunLogger: ...


class RunHooks:
    """A run in one process, by default: it resumes from and checkpoints to output_dir."""

    rank = 0  # the rank that evaluates, keeps the history and writes the run's files
    world_size = 1
    marks_resume = False  # add "resumed_from_epoch" to the metrics of a resumed run

    def restore(self, trainer: RunTrainer) -> None:
        """Load the state the run continues from, if any (before anything is written)."""
        trainer.maybe_resume()

    def loss_fn(self, trainer: RunTrainer) -> Callable | None:
        """`loss_fn(batch, step_seed)` for `Trainer.train_epoch`; None: the local loss."""
        return None

    def before_epoch(self, epoch: int) -> None:
        pass

    def after_epoch(self, trainer: RunTrainer, epoch: int, metrics: dict) -> Path | None:
        """Checkpoint (and report) the finished epoch; the checkpoint's path, where local."""
        return save_checkpoint(trainer.checkpoint_path, trainer.state(epoch))

    def after_logging(self, trainer: RunTrainer, epoch: int, metrics: dict) -> None:
        """Called once the epoch is logged (history, MLflow): a report that can end the run at
        once (a Tune scheduler stopping the trial) belongs here, so the logs hold the epoch."""

    def after_restored_finished_run(self, trainer: RunTrainer) -> None:
        """Called when the restored state had trained every epoch already."""

    def open_logger(self, trainer: RunTrainer, opener: OpenLogger | None) -> RunLogger | None:
        """The run's logger from the caller's `opener` (None: the run logs nothing), opened
        after `restore`: a restarted worker continues the run it logged to."""
        if opener is None:
            return None
        return opener(resume=self.tracking_resume(trainer),
                      tags={**trainer.run_tags, **self.tracking_tags()})

    def tracking_resume(self, trainer: RunTrainer) -> bool | None:
        """Whether MLflow continues the output folder's run (None: config.train.resume)."""
        return None

    def tracking_tags(self) -> dict[str, Any]:
        return {}


LocalRun = RunHooks
