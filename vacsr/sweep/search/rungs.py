"""ASHA's rungs decided in creation order (paper sec. 4.1 searches with ASHA; Li et al. 2020,
Alg. 2), kept in the sweep folder so that a resumed search decides what the stopped one would.

Asynchronous ASHA compares a trial, at the first rung it reaches, with the values trials reported
there before it: with several trials of a dataset running at once, "before" is arrival order, and
two runs of one sweep can stop different trials. Here a trial's decision at a rung compares it with
the trials created before it only, and only once each of them has either reached that rung (its
value there counts) or ended below it (stopped at a lower rung, failed, or ran fewer epochs). A
trial whose comparison is not complete yet waits at the rung. With one trial at a time every
earlier trial has ended when a trial reports, so the decisions are asynchronous ASHA's.

The ledger is written whole at each change (vacsr/atomic.py); Tune restores its scheduler without
state on --resume, so the ledger is what carries the rungs, the values and the decisions across a
stop. Nothing here imports Ray: the Tune scheduler that acts on the decisions is
vacsr/sweep/search/asha.py.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from vacsr.atomic import atomic_write_json
from vacsr.errors import ConfigError
from vacsr.sweep.spec.schedule import AshaSchedule

CONTINUE, STOP = "continue", "stop"


def _entry() -> dict:
    # rungs: rung -> value reported there; passed: rungs decided CONTINUE; stop: the STOP note;
    # ended: the epoch the trial ended at (stopped, failed or done), None while it may go on
    return {"rungs": {}, "passed": [], "stop": None, "ended": None}


class RungLedger:
    """Per Tune trial id: its value at each rung it reached, the rungs it passed, its stop (the
    rung, its value there and the values it was compared with) and where it ended."""

    def __init__(self, path: Path, schedule: AshaSchedule, max_epochs: int, mode: str) -> None:
        self.path = Path(path)
        self.schedule, self.mode = schedule, mode
        self.rungs = schedule.rungs(max_epochs)  # lowest first
        self.trials: dict[str, dict] = self._read()

    def _read(self) -> dict[str, dict]:
        if not self.path.is_file():
            return {}
        try:
            trials = json.loads(self.path.read_text())
            assert isinstance(trials, dict) and all(
                isinstance(e, dict) and set(e) == set(_entry()) for e in trials.values())
        except (OSError, ValueError, UnicodeDecodeError, AssertionError):
            raise ConfigError(f"{self.path}: not a rung ledger of this sweep's ASHA; "
                              "the search cannot be resumed from it") from None
        for entry in trials.values():  # JSON keys are strings
            entry["rungs"] = {int(r): v for r, v in entry["rungs"].items()}
        return trials

    def __getstate__(self) -> dict:
        """Tune pickles the scheduler with the Tuner once, at its start: unpickled on --resume,
        the ledger reads the file again instead of taking that first, empty, state."""
        return {k: v for k, v in self.__dict__.items() if k != "trials"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.trials = self._read()

    def _write(self) -> None:
        atomic_write_json(self.path, self.trials)

    def entry(self, trial_id: str) -> dict:
        return self.trials.setdefault(trial_id, _entry())

    # ------------------------------------------------------------ what trials report
    def record(self, trial_id: str, epoch: float, value: float) -> None:
        """A report: the highest rung `epoch` reaches that the trial has no value at yet gets
        `value` (Ray's ASHAScheduler records a report at one rung, the highest it reaches)."""
        entry = self.entry(trial_id)
        if entry["ended"] is not None and entry["stop"] is None:
            entry["ended"] = None  # a failed trial that --resume continues
        for rung in reversed(self.rungs):
            if epoch >= rung:
                if rung not in entry["rungs"]:
                    entry["rungs"][rung] = value
                    self._write()
                return

    def end(self, trial_id: str, epoch: float | None) -> None:
        entry = self.entry(trial_id)
        if entry["ended"] is None:
            entry["ended"] = epoch if epoch is not None else 0
            self._write()

    def undecided(self, trial_id: str) -> int | None:
        """The lowest rung the trial reached and has no decision at; None when it has none or
        was stopped."""
        entry = self.trials.get(trial_id)
        if entry is None or entry["stop"] is not None:
            return None
        open_rungs = sorted(r for r in entry["rungs"] if r not in entry["passed"])
        return open_rungs[0] if open_rungs else None

    def stopped(self, trial_id: str) -> bool:
        return self.trials.get(trial_id, {}).get("stop") is not None

    # ------------------------------------------------------------ decisions
    def decide(self, trial_id: str, rung: int, earlier: list[str]) -> str | None:
        """CONTINUE or STOP for the trial at `rung`, compared with the trials `earlier` (created
        before it); None while one of those has neither reached the rung nor ended."""
        values = []
        for other in earlier:
            entry = self.trials.get(other)
            if entry is not None and rung in entry["rungs"]:
                values.append(entry["rungs"][rung])
            elif entry is None or (entry["ended"] is None and entry["stop"] is None):
                return None
        entry = self.entry(trial_id)
        value = entry["rungs"][rung]
        if self._below_cutoff(value, values):
            entry["stop"] = {"rung": rung, "value": value, "compared": sorted(values)}
            entry["ended"] = rung
            self._write()
            return STOP
        entry["passed"].append(rung)
        self._write()
        return CONTINUE

    def _below_cutoff(self, value: float, values: list[float]) -> bool:
        """Ray's ASHA cutoff: the (1 - 1/reduction_factor) quantile of the values at the rung,
        in the direction of the mode; a trial below it stops."""
        sign = 1.0 if self.mode == "max" else -1.0
        if not values or not isinstance(value, (int, float)) or math.isnan(value):
            return False
        cutoff = np.nanpercentile([sign * v for v in values],
                                  (1 - 1 / self.schedule.reduction_factor) * 100)
        return bool(sign * value < cutoff)

    def verdicts(self) -> list[tuple[str, int, str]]:
        """Every decision made so far: (trial id, rung, CONTINUE or STOP)."""
        return [(tid, rung, CONTINUE) for tid, e in self.trials.items() for rung in e["passed"]] \
            + [(tid, e["stop"]["rung"], STOP) for tid, e in self.trials.items() if e["stop"]]

    def stops(self) -> dict[str, dict]:
        """Each stopped trial's note, as the trial's MLflow run records it
        (vacsr/sweep/search/tune.py, `record_selection_values`)."""
        return {tid: dict(e["stop"]) for tid, e in self.trials.items() if e["stop"] is not None}
