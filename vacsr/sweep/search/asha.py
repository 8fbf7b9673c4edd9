"""ASHA early stopping whose decisions do not depend on timing (paper sec. 4.1 searches with
ASHA): a Tune scheduler over the rung ledger of vacsr/sweep/search/rungs.py.

A trial whose comparison at a rung is not complete (a trial created before it has neither reached
the rung nor ended) waits there. A trial that trains in its Tune actor waits in it, keeping its
resources, for the verdict the scheduler posts to the dataset's gate
(vacsr/sweep/search/rung_gate.py), as long as every trial it waits for holds resources too (is
running): none of them then needs a slot it holds. Otherwise, and for trials of several Ray Train
workers, the trial is paused: Tune keeps its last checkpoint and frees its resources. Once the
comparison is complete the trial is stopped where it waits, or goes on (from its checkpoint when
a slot is free, if it was paused). The decision and the trial's checkpoint are the same whichever
trial reported first and however it waited, so the stops, the values selection compares and the
table are too. Each stop is recorded with its rung and the values it was compared with, for the
trial's MLflow run.
"""
from __future__ import annotations

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from vacsr.sweep.search.rung_gate import GatePoster
from vacsr.sweep.search.rungs import RungLedger

_WAITING = (Trial.PAUSED, Trial.PENDING)  # a trial that holds no resources


class OrderedASHA(FIFOScheduler):
    """ASHA (one bracket) deciding each trial against the trials created before it, in the
    searcher's creation order (vacsr/sweep/search/optuna_searcher.py)."""

    _supports_buffered_results = False  # every epoch's report reaches the rungs

    def __init__(self, ledger: RungLedger, searcher, *, time_attr: str,
                 ordered: bool = True, gate: str | None = None) -> None:
        super().__init__()
        self.ledger, self.searcher, self.time_key = ledger, searcher, time_attr
        self.ordered = ordered  # False (--free-running): Ray's ASHA, arrival order, no waits
        # the gate's actor name when trials wait in their actors; None: waiting trials pause
        self.gate = GatePoster(gate) if gate is not None else None
        self._settling, self._reporting = False, None

    def set_search_properties(self, metric, mode, **spec) -> bool:
        super().set_search_properties(metric, mode, **spec)
        return True

    # ------------------------------------------------------------ what Tune tells it
    def on_trial_result(self, controller, trial, result: dict) -> str:
        now, value = result.get(self.time_key), result.get(self._metric)
        if not isinstance(now, (int, float)) or not isinstance(value, (int, float)):
            return TrialScheduler.CONTINUE
        if self.ledger.stopped(trial.trial_id):  # decided while it was not running
            return self._stop(trial)
        self.ledger.record(trial.trial_id, now, float(value))
        self._reporting = trial.trial_id  # stopped by the STOP returned below, not in _settle
        try:
            self._settle(controller)  # this trial's open rungs, and others' its value completes
        finally:
            self._reporting = None
        if self.ledger.stopped(trial.trial_id):
            return self._stop(trial)
        if self.ledger.undecided(trial.trial_id) is not None and not self._waits_in_actor(
                controller, trial):
            return TrialScheduler.PAUSE  # Tune keeps its checkpoint; it goes on once decided
        return TrialScheduler.CONTINUE  # decided CONTINUE, or it waits for its verdict in its actor

    def on_trial_complete(self, controller, trial, result: dict) -> None:
        self._ended(controller, trial, (result or {}).get(self.time_key))

    def on_trial_error(self, controller, trial) -> None:
        self._ended(controller, trial, (trial.last_result or {}).get(self.time_key))

    def on_trial_remove(self, controller, trial) -> None:
        self._ended(controller, trial, (trial.last_result or {}).get(self.time_key))

    def _ended(self, controller, trial, epoch) -> None:
        self.ledger.end(trial.trial_id, epoch if isinstance(epoch, (int, float)) else None)
        self._settle(controller)

    def choose_trial_to_run(self, controller):
        """A paused trial whose rung decided CONTINUE first (the oldest), else the next new
        trial; never one that still waits for its decision."""
        self._settle(controller)
        trials = self._ordered(controller)
        for status in (Trial.PAUSED, Trial.PENDING):
            for trial in trials:
                if trial.status == status and self.ledger.undecided(trial.trial_id) is None \
                        and not self.ledger.stopped(trial.trial_id):
                    return trial
        return None

    def debug_string(self) -> str:
        return f"OrderedASHA: {len(self.ledger.stops())} trial(s) stopped"

    # ------------------------------------------------------------ decisions
    def _ordered(self, controller) -> list:
        index = self.searcher.creation_index
        return sorted(controller.get_trials(), key=lambda t: index(t.trial_id))

    def _earlier(self, controller, trial, rung: int) -> list[str]:
        """The trials the trial is compared with at `rung`: those created before it; free-running,
        those that reported there before it (asynchronous ASHA)."""
        if not self.ordered:
            return [tid for tid, entry in self.ledger.trials.items()
                    if tid != trial.trial_id and rung in entry["rungs"]]
        index = self.searcher.creation_index(trial.trial_id)
        return [t.trial_id for t in controller.get_trials()
                if self.searcher.creation_index(t.trial_id) < index]

    def _waits_in_actor(self, controller, trial) -> bool:
        """Whether the undecided trial may wait in its actor: a gate is there and every trial it
        is compared with that has not ended is running (the trial holds no slot they need)."""
        if self.gate is None:
            return False
        index = self.searcher.creation_index(trial.trial_id)
        for other in controller.get_trials():
            entry = self.ledger.trials.get(other.trial_id)
            ended = entry is not None and (entry["ended"] is not None or entry["stop"] is not None)
            if self.searcher.creation_index(other.trial_id) < index and not ended \
                    and other.status not in (Trial.RUNNING, Trial.TERMINATED, Trial.ERROR):
                return False
        return True

    def _settle(self, controller) -> None:
        """Decide every trial that waits at a rung and whose comparison is now complete, oldest
        first, until nothing changes: a stop ends a trial below the higher rungs, which can
        complete a later trial's comparison there. Each decision is posted to the gate, where a
        trial waiting in its actor takes it; a stopped trial is ended in Tune at once, whether it
        waits paused or in its actor (without a gate, a running one stops at its next report)."""
        if self._settling:  # stop_trial calls back into on_trial_remove
            return
        self._settling = True
        try:
            changed = True
            while changed:
                changed = False
                for trial in self._ordered(controller):
                    if trial.status in (Trial.TERMINATED, Trial.ERROR):
                        changed |= self._ended_unseen(trial)
                        continue
                    if self.ledger.stopped(trial.trial_id):
                        if trial.status in _WAITING or trial.is_saving or (
                                self.gate is not None and trial.status == Trial.RUNNING
                                and trial.trial_id != self._reporting):
                            self._stop(trial)
                            controller.stop_trial(trial)
                            changed = True
                        continue
                    rung = self.ledger.undecided(trial.trial_id)
                    if rung is None:
                        continue
                    verdict = self.ledger.decide(trial.trial_id, rung,
                                                 self._earlier(controller, trial, rung))
                    if verdict is not None:
                        if self.gate is not None:
                            self.gate.post(trial.trial_id, rung, verdict)
                        changed = True
        finally:
            self._settling = False

    def _stop(self, trial) -> str:
        """STOP, the searcher told the trial's value at its stop rung: Tune tells it the last
        result, which is an epoch beyond the rung for a trial Tune restarted on --resume before
        its stop was decided (Tune starts restored trials without asking the scheduler)."""
        self.searcher.note_stop(trial.trial_id, self.ledger.trials[trial.trial_id]["stop"]["value"])
        return TrialScheduler.STOP

    def _ended_unseen(self, trial) -> bool:
        """Whether `trial` ended without Tune telling the scheduler and the searcher (a trial
        whose reused actor failed to reset is set ERROR directly): it is ended here, and the
        searcher is told it failed, or the trials after it would wait for it forever."""
        entry = self.ledger.trials.get(trial.trial_id)
        if entry is not None and entry["ended"] is not None:
            return False
        self.ledger.end(trial.trial_id, (trial.last_result or {}).get(self.time_key))
        self.searcher.on_trial_complete(trial.trial_id, error=trial.status == Trial.ERROR,
                                        result=trial.last_result or None)
        return True
