"""What the two places a run trains under Ray share: `RayRun`, the base of the Ray Train worker's
hooks (`vacsr.distributed.worker.RayTrainRun`) and of the one-worker Tune trial's
(`vacsr.sweep.search.trial_run.TuneTrialRun`). Either restores from the checkpoint Ray reported
last, reports every epoch with its checkpoint (written to a scratch folder in the run's own
folder, which Ray copies into its storage), reports a restored finished run's result again, and
continues its MLflow run when restarted. What differs is Ray's API (`ray.train` or `tune`), when
the report goes out, and ranks.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from vacsr.distributed.worker_gpus import placement_tags
from vacsr.errors import CheckpointError
from vacsr.train.checkpoint import load_checkpoint, save_checkpoint
from vacsr.train.run_files import CHECKPOINT_FILE
from vacsr.train.run_hooks import RunHooks
from vacsr.train.scratch import scratch_folder

if TYPE_CHECKING:
    from vacsr.train.loop import Trainer


def read_reported(checkpoint, output_dir: str | Path, device="cpu") -> dict:
    """The vacsr checkpoint in a checkpoint Ray reported (a Ray Train or Tune `Checkpoint`),
    read from a copy of this process's own in the run folder `output_dir` (train/scratch.py).
    `Checkpoint.as_directory` shares one temporary download among the processes of a node, and a
    Train rank that reads it while another rank downloads it again sees a torn file: the two
    ranks would then resume from different epochs and wait for each other in DDP forever.
    CheckpointError names the file on Ray's storage."""
    import pyarrow.fs as pafs

    source = f"{checkpoint.path.rstrip('/')}/{CHECKPOINT_FILE}"
    if isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        return load_checkpoint(source, device)
    with scratch_folder(output_dir) as folder:
        local = folder / CHECKPOINT_FILE
        try:
            with checkpoint.filesystem.open_input_stream(source) as stream, \
                    open(local, "wb") as out:
                shutil.copyfileobj(stream, out)
        except (OSError, ValueError) as exc:  # pyarrow: FileNotFoundError, ArrowInvalid...
            raise CheckpointError(f"{source}: cannot be read ({type(exc).__name__})") from None
        try:
            return load_checkpoint(local, device)
        except CheckpointError as exc:
            raise CheckpointError(str(exc).replace(str(local), source)) from None


def restore_reported(trainer: Trainer, checkpoint) -> bool:
    """Load a checkpoint Ray reported (None: nothing to do) into `trainer`; True when it loaded
    (a damaged one is not: read_or_restart)."""
    if checkpoint is None:
        return False
    state = read_or_restart(lambda: read_reported(checkpoint, trainer.output_dir, trainer.device))
    if state is None:
        return False
    trainer.load_state(state)
    return True


def read_or_restart(read: Callable[[], dict]) -> dict | None:
    """The checkpoint state `read()` returns; None when it is damaged (zero bytes, not a
    checkpoint, as a full disk or a hand edit leaves it: CheckpointError), which is named in one
    line, and the run trains again from its first epoch: runs are seeded, so that repeats what
    the lost epochs computed."""
    try:
        return read()
    except CheckpointError as exc:
        print(f"vacsr: {exc}; training the run again from its first epoch", file=sys.stderr,
              flush=True)
        return None


class RayRun(RunHooks):
    """A run Ray restarts from its reported checkpoints; subclasses name Ray's API for it."""

    marks_resume = True  # a run restarted from a checkpoint says so in the history

    def reported_checkpoint(self):
        """The checkpoint Ray restores this run from (None on a first start)."""
        raise NotImplementedError

    def send(self, metrics: dict, folder: str | None) -> None:
        """Report `metrics` to Ray, with the checkpoint in `folder` (None: this rank has none)."""
        raise NotImplementedError

    def restore(self, trainer: Trainer) -> None:
        restore_reported(trainer, self.reported_checkpoint())

    def report(self, trainer: Trainer, epoch: int, metrics: dict) -> None:
        """Report the epoch; rank 0 writes its checkpoint for Ray to copy into its storage, in a
        scratch folder of the run's own (train/scratch.py). The report also carries the prefix
        cache's lines on damaged files it rebuilt (for the sweep's console)."""
        if trainer.prefix_cache is not None:
            metrics = {**metrics, **trainer.prefix_cache.stats.rebuilt_note()}
        if self.rank != 0:
            self.send(metrics, None)
            return
        with scratch_folder(trainer.output_dir) as folder:
            save_checkpoint(folder / CHECKPOINT_FILE, trainer.state(epoch))
            self.send(metrics, str(folder))

    def after_restored_finished_run(self, trainer: Trainer) -> None:
        # restarted after its last epoch (a Tune trial resumed by a new driver): report the final
        # result again, or the Tune trial ends without its metric
        self.report(trainer, trainer.start_epoch - 1, dict(trainer.history[-1]))

    def tracking_resume(self, trainer: Trainer) -> bool:
        return trainer.start_epoch > 0 or trainer.config.train.resume  # a restarted run

    def tracking_tags(self) -> dict[str, Any]:
        return placement_tags()
