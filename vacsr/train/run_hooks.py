"""What differs between the places one training run runs in: `Trainer.fit` is the lifecycle
(config saved, epochs, evaluation, history, checkpoint, metrics.json, MLflow), a RunHooks the
place. `LocalRun` is a run in this process; `vacsr.distributed.worker.RayTrainRun` a Ray Train
worker's share of a run (a `vacsr train --ray` run, a sweep's final run, or a Tune trial of
several workers, whose reports its TuneReportCallback passes on to Tune);
`vacsr.sweep.search.trial_run.TuneTrialRun` a one-worker Tune trial training in its trial actor.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from vacsr.errors import CheckpointError
from vacsr.train.checkpoint import load_checkpoint, save_checkpoint
from vacsr.train.files import CHECKPOINT_FILE


def restore_reported(trainer: Trainer, checkpoint) -> bool:
    """Load a checkpoint Ray reported (a Ray Train or Tune `Checkpoint`; None: nothing to do)
    into `trainer`; True when it loaded. A damaged one (zero bytes, not a checkpoint, as a full
    disk or a hand edit leaves it) is named in one line and the run trains again from its first
    epoch: runs are seeded, so that repeats what the lost epochs computed."""
    if checkpoint is None:
        return False
    with checkpoint.as_directory() as folder:
        try:
            state = load_checkpoint(Path(folder) / CHECKPOINT_FILE, trainer.device)
        except CheckpointError as exc:
            print(f"vacsr: {exc}; training the run again from its first epoch", file=sys.stderr,
                  flush=True)
            return False
    trainer.load_state(state)
    return True


class RunHooks:
    """A run in one process, by default: it resumes from and checkpoints to output_dir. (The
    `Trainer` of the annotations is vacsr.train.loop's, which imports this module.)"""

    rank = 0  # the rank that evaluates, keeps the history and writes the run's files
    world_size = 1
    marks_resume = False  # add "resumed_from_epoch" to the metrics of a resumed run

    def restore(self, trainer: Trainer) -> None:
        """Load the state the run continues from, if any (before anything is written)."""
        trainer.maybe_resume()

    def loss_fn(self, trainer: Trainer) -> Callable | None:
        """`loss_fn(batch, step_seed)` for `Trainer.train_epoch`; None: the local loss."""
        return None

    def before_epoch(self, epoch: int) -> None:
        pass

    def after_epoch(self, trainer: Trainer, epoch: int, metrics: dict) -> Path | None:
        """Checkpoint (and report) the finished epoch; the checkpoint's path, where local."""
        return save_checkpoint(trainer.checkpoint_path, trainer.state(epoch))

    def after_logging(self, trainer: Trainer, epoch: int, metrics: dict) -> None:
        """Called once the epoch is logged (history, MLflow): a report that can end the run at
        once (a Tune scheduler stopping the trial) belongs here, so the logs hold the epoch."""

    def after_restored_finished_run(self, trainer: Trainer) -> None:
        """Called when the restored state had trained every epoch already."""

    def tracking_resume(self, trainer: Trainer) -> bool | None:
        """Whether MLflow continues the output folder's run (None: config.train.resume)."""
        return None

    def tracking_tags(self) -> dict[str, Any]:
        return {}


LocalRun = RunHooks
