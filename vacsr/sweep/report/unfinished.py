"""What of a sweep has not finished, as `vacsr best` reads it back from the MLflow store: its units
whose runs a stop closed (KILLED) or that are RUNNING (a live driver's, or left so by a driver
killed outright: the store cannot tell those apart), the units its run lists (COMPARISON_INFO)
that never started, and the lines that say so before any result, with how the sweep continues.
A unit that failed has finished (its reason is its result); a sweep of one method lists no
units, so only its started ones are named."""
from __future__ import annotations

from dataclasses import dataclass

from vacsr.records.artifacts import COMPARISON_INFO
from vacsr.records.sweep_records import (
    DATASET_TAG,
    KIND_TAG,
    SWEEP_TAG,
    UNFINISHED_STATUSES,
    SweepRecords,
)
from vacsr.sweep.spec.kind import sweep_script

NOT_STARTED = "not started"
# what an unfinished run's status tells: a SIGTERM's clean-up closes runs KILLED, a SIGKILL
# leaves them RUNNING
MEANING = {"RUNNING": "its driver is running, or was killed", "KILLED": "stopped"}
NAMED = 8  # units named per state; the comparison's rows name every one


@dataclass(frozen=True)
class Progress:
    """A sweep's state as its records hold it."""
    sweep: str
    kind: str
    status: str  # the sweep's own run's
    unfinished: dict[str, str]  # unit -> its run's status, or NOT_STARTED; in the sweep's order
    units: int | None = None  # how many units the sweep runs, where its run lists them

    @property
    def finished(self) -> bool:
        return not self.unfinished and self.status not in UNFINISHED_STATUSES


def unit_note(state: str) -> str:
    """An unfinished unit's cell in the comparison (never FAILED: it has no result yet)."""
    return f"unfinished ({state if state == NOT_STARTED else f'run {state}'})"


def sweep_progress(parent, runs: list, listed: list[str] | None = None) -> Progress:
    """`parent`: the sweep's run; `runs`: its units' runs; `listed`: every unit it runs, in
    order (None where its run lists none: a sweep of one method)."""
    status = {run.data.tags[DATASET_TAG]: run.info.status for run in runs}
    order = list(dict.fromkeys([*(listed or []), *status]))
    left = {unit: status.get(unit, NOT_STARTED) for unit in order}
    tags = parent.data.tags
    return Progress(tags.get(SWEEP_TAG, ""), tags.get(KIND_TAG, ""), parent.info.status,
                    {u: s for u, s in left.items() if s in (*UNFINISHED_STATUSES, NOT_STARTED)},
                    None if listed is None else len(listed))


def read_progress(records: SweepRecords, parent) -> Progress:
    """The progress of the sweep whose run is `parent`, from the store."""
    info = records.artifact_json(parent.info.run_id, COMPARISON_INFO)
    return sweep_progress(parent, records.dataset_runs(parent),
                          None if info is None else list(info["units"]))


def _names(units: list[str]) -> str:
    more = len(units) - NAMED
    return ", ".join(units[:NAMED]) + (f" and {more} more" if more > 0 else "")


def notice(progress: Progress) -> str:
    """The lines an unfinished sweep's output starts with, then a blank line; "" when it
    finished."""
    p = progress
    if p.finished:
        return ""
    if not p.unfinished:  # every unit ended; the sweep's own end did not run
        head = f"its run is {p.status} ({MEANING[p.status]})"
    elif p.units is None:
        head = (f"{len(p.unfinished)} dataset(s) have not finished (one not started has no "
                "record to name)")
    else:
        head = f"{len(p.unfinished)} of its {p.units} units have not finished"
    lines = [f"sweep {p.sweep} is unfinished: {head}"]
    for state in (*UNFINISHED_STATUSES, NOT_STARTED):
        units = [unit for unit, s in p.unfinished.items() if s == state]
        if units:
            label = state if state == NOT_STARTED else f"run {state} ({MEANING[state]})"
            lines.append(f"  {label}: {_names(units)}")
    live = "RUNNING" in (p.status, *p.unfinished.values())
    lines.append(f"{'if its driver is gone, ' if live else ''}continue it: "
                 f"{sweep_script(p.kind)} --name {p.sweep} --resume, with the other flags it "
                 "started with")
    return "\n".join(lines) + "\n\n"
