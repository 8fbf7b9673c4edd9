"""A rehearsed Tune trial (vacsr/sweep/rehearsal/run.py in the trial actor): it restores from
the checkpoint Tune reported last and reports every epoch with its checkpoint, as a trial that
trains in its actor does (vacsr/sweep/search/trial_run.py), so that ASHA, the searcher, Tune's
storage and a `--resume` act on it as on a real trial."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from ray import tune

from vacsr.config import Config
from vacsr.errors import CheckpointError
from vacsr.sweep.rehearsal.clock import UnitClock
from vacsr.sweep.rehearsal.run import RehearsalPlace, read_checkpoint, rehearse, write_checkpoint
from vacsr.train.run_files import CHECKPOINT_FILE
from vacsr.train.scratch import scratch_folder


class TuneRehearsal(RehearsalPlace):
    """`report(metrics, checkpoint)` reports an epoch to Tune and `restarted(epochs)` is called
    on a restart from a checkpoint: the trial's own (vacsr/sweep/search/rung_gate.py, where a
    trial waits for its rungs' decisions), as a trial that trains in its actor has them."""

    def __init__(self, report: Callable[[dict, tune.Checkpoint], None],
                 restarted: Callable[[int], None]) -> None:
        self._report, self._restarted = report, restarted

    def restore(self, output_dir: Path) -> list[dict]:
        checkpoint = tune.get_checkpoint()
        if checkpoint is None:
            return []
        try:
            with checkpoint.as_directory() as folder:
                history = read_checkpoint(Path(folder) / CHECKPOINT_FILE)
        except CheckpointError as exc:  # as a real trial: said once, and the run starts again
            print(f"vacsr: {exc}; rehearsing the run again from its first epoch",
                  file=sys.stderr, flush=True)
            return []
        self._restarted(len(history))  # at a rung: not past it undecided
        return history

    def report(self, output_dir: Path, metrics: dict, history: list[dict]) -> None:
        with scratch_folder(output_dir) as folder:
            write_checkpoint(folder / CHECKPOINT_FILE, history)
            self._report(metrics, tune.Checkpoint.from_directory(str(folder)))


def rehearse_in_trial(config: Config, clock: UnitClock,
                      report: Callable[[dict, tune.Checkpoint], None],
                      restarted: Callable[[int], None]) -> None:
    rehearse(config, clock, TuneRehearsal(report, restarted))
