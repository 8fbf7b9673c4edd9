"""ASHA early stopping that records why it stopped a trial (paper sec. 4.1 searches with ASHA;
the stops land on the trial's MLflow run as tags, so a researcher sees which trials were cut).
"""
from __future__ import annotations

import json
from pathlib import Path

from ray.tune.schedulers import ASHAScheduler

from vacsr.atomic import atomic_write_json
from vacsr.sweep.spec.schedule import AshaSchedule


class AshaStops:
    """Each trial ASHA stopped: the rung (epoch), its value there and the values it was compared
    with, kept in the sweep folder for the trial's MLflow run (`record_selection_values`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> dict[str, dict]:
        try:  # informative only: a damaged file loses the note, never a result
            stops = json.loads(self.path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            return {}
        return stops if isinstance(stops, dict) else {}

    def add(self, trial_id: str, entry: dict) -> None:
        atomic_write_json(self.path, {**self.read(), trial_id: entry})


class RecordingASHA(ASHAScheduler):
    """ASHA (one bracket) that notes why it stops a trial. The rungs and the record per rung
    mirror ASHA's own bookkeeping (Li et al. 2020, Alg. 2): a trial's value is compared, at the
    first rung it reaches, with the values trials reported there before it. With several trials
    of one dataset running at once, which trials reported before depends on timing."""

    def __init__(self, stops: AshaStops, schedule: AshaSchedule, max_epochs: int, *,
                 time_attr: str) -> None:
        super().__init__(time_attr=time_attr, max_t=schedule.max_t(max_epochs),
                         grace_period=schedule.grace_period,
                         reduction_factor=schedule.reduction_factor)
        self.stops, self.time_key = stops, time_attr
        rungs = schedule.rungs(max_epochs)
        self.rungs: dict[int, dict[str, float]] = {m: {} for m in reversed(rungs)}

    def on_trial_result(self, *args) -> str:  # (controller, trial, result), as Tune calls it
        decision = super().on_trial_result(*args)
        trial, result = args[-2], args[-1]
        now, value = result.get(self.time_key), result.get(self.metric)
        if not isinstance(now, (int, float)) or not isinstance(value, (int, float)):
            return decision
        for milestone, recorded in self.rungs.items():  # highest rung first
            if now < milestone or trial.trial_id in recorded:
                continue
            if decision == ASHAScheduler.STOP:
                self.stops.add(trial.trial_id, {"rung": milestone, "value": value,
                                                "compared": sorted(recorded.values())})
            recorded[trial.trial_id] = value
            break
        return decision
