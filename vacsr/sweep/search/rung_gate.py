"""Where a trial waits for its rung's decision while keeping its actor and resources: the other
way to wait of vacsr/sweep/search/asha.py (paper sec. 4.1 searches with ASHA).

With several trials of a dataset at once, a trial's ASHA decision at a rung needs the values of
every trial created before it there (vacsr/sweep/search/rungs.py). Paused by Tune, a waiting
trial writes its checkpoint, gives its actor back and is placed again, possibly on another GPU,
once decided; that costs a model load and a restore each time. Instead, a trial that trains in its
Tune actor reports as usual, is told CONTINUE by the scheduler, and then asks the dataset's gate
(one async Ray actor, named, of no resources) for the verdict before it trains on. The scheduler
posts every decision it makes there: CONTINUE lets the trial go on; STOP ends it where Tune's own
stop ends it, inside its report (SystemExit: its MLflow run closes as KILLED), and the scheduler
stops it in Tune. A trial Tune restarts from a checkpoint taken at a rung (a lost actor, a
--resume) asks before its next epoch too, so no trial trains past a rung undecided.

The decision does not depend on how a trial waited, so the records are those of a paused one.
Nothing here is pickled with Tune's state but the gate's name: each run's search of the dataset
(first or resumed) creates the gate, holding the decisions the ledger already has.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Optional

import ray
from ray import tune

from vacsr.sweep.search.rungs import CONTINUE, STOP

_POLL_S = 30.0  # one wait call's longest block; the trial asks again after it


def verdict_key(trial_id: str, rung: int) -> str:
    return f"{trial_id}@{int(rung)}"


@dataclass(frozen=True)
class GateSpec:
    """What a trial needs to find its dataset's gate: its actor name and the rungs' epochs."""

    name: str
    rungs: tuple[int, ...]


def gate_name(experiment: str) -> str:
    """The gate of a dataset's Tune experiment (vacsr/sweep/plan/folders.py, `tune_experiment`:
    no other sweep's has its name): the same for a resumed run, whose restored scheduler holds
    it, distinct for two sweeps on one cluster."""
    return f"vacsr-rung-gate-{experiment}"


class _Gate:
    """The verdicts posted so far, and the trials waiting for theirs."""

    def __init__(self, verdicts: dict[str, str]) -> None:
        self.verdicts = dict(verdicts)
        self.events: dict[str, asyncio.Event] = {}
        self.asked: dict[str, float] = {}  # key -> when a trial first waited for it
        self.waits, self.waited_s = 0, 0.0  # waits that blocked, and for how long in all

    def _event(self, key: str) -> asyncio.Event:
        return self.events.setdefault(key, asyncio.Event())

    async def post(self, verdicts: dict[str, str]) -> None:
        for key, verdict in verdicts.items():
            self.verdicts[key] = verdict
            self._event(key).set()
            if key in self.asked:
                self.waits += 1
                self.waited_s += time.monotonic() - self.asked.pop(key)

    async def wait(self, key: str, timeout_s: float) -> Optional[str]:
        if key not in self.verdicts:
            self.asked.setdefault(key, time.monotonic())
            try:
                await asyncio.wait_for(self._event(key).wait(), timeout_s)
            except asyncio.TimeoutError:
                return None
        return self.verdicts[key]


    async def stats(self) -> tuple[int, float]:
        return self.waits, self.waited_s


def wait_note(stats: tuple[int, float]) -> str | None:
    """The console's line on the waits (None: no trial waited)."""
    waits, seconds = stats
    if not waits:
        return None
    return (f"{waits} rung decision(s) waited for in the trials' actors, {seconds:.0f} s in all "
            "(each trial is compared with those created before it)")


def open_gate(spec: GateSpec, verdicts: list[tuple[str, int, str]]):
    """Create the dataset's gate (this process owns it: it ends with the search), holding the
    decisions already made (`verdicts`: trial id, rung, CONTINUE/STOP; RungLedger.verdicts)."""
    held = {verdict_key(trial_id, rung): verdict for trial_id, rung, verdict in verdicts}
    return ray.remote(_Gate).options(name=spec.name, num_cpus=0,
                                     max_concurrency=1000).remote(held)


class GatePoster:
    """The scheduler's side: posts verdicts to the gate by name (the handle is looked up in the
    process that posts, never pickled with Tune's state)."""

    def __init__(self, name: str) -> None:
        self.name, self._handle = name, None

    def __getstate__(self) -> dict:
        return {"name": self.name, "_handle": None}

    def post(self, trial_id: str, rung: int, verdict: str) -> None:
        if self._handle is None:
            self._handle = ray.get_actor(self.name)
        self._handle.post.remote({verdict_key(trial_id, rung): verdict})  # no reply awaited


# ---------------------------------------------------------------- the trial's side
_current: list[Optional[GateSpec]] = [None]  # the trial this actor runs now (run_trial sets it)


def enter(spec: Optional[GateSpec]) -> None:
    """The gate of the trial that starts in this actor (None: its scheduler pauses it)."""
    _current[0] = spec


def await_verdict(epochs_done: int) -> None:
    """Before training past `epochs_done` epochs: when that is a rung, wait for the trial's
    decision there; on STOP end the trial as Tune's stop does, inside the trial's thread."""
    spec = _current[0]
    if spec is None or int(epochs_done) not in spec.rungs:
        return
    gate = ray.get_actor(spec.name)
    key = verdict_key(tune.get_context().get_trial_id(), epochs_done)
    verdict = None
    while verdict is None:
        verdict = ray.get(gate.wait.remote(key, _POLL_S))
    if verdict == STOP:
        raise SystemExit(0)
    assert verdict == CONTINUE, verdict


def report_and_wait(metrics: dict, checkpoint: Optional[tune.Checkpoint]) -> None:
    """tune.report, then the rung's decision when the report is at one."""
    tune.report(metrics, checkpoint=checkpoint)
    epoch = metrics.get("epoch")
    if isinstance(epoch, (int, float)) and float(epoch).is_integer():
        await_verdict(int(epoch))
