"""sweep_state.json (its place: vacsr/sweep/plan/folders.py): what a restarted driver
(`--resume`) needs beyond Tune's experiment folders and the Optuna study: the MLflow run ids and
each finished dataset's per-seed results (and, with --methods, the runs of each method's average
row: `averages`).

Only the driver's main thread changes and writes it (datasets report back to it), so no lock.
A file of another shape (edited by hand, or not this file at all) stops the resume with one
line: read as empty, it would make the resume open every MLflow run a second time.

The state carries its record format (`"format": 3`). A sweep folder whose state has none or
another was written by another vacsr, whose Tune and Optuna pickles name classes this one does
not have (format 2: the scheduler RecordingASHA, Tune experiments named by the dataset alone):
`--resume` of it stops with one line (`check_format`) instead of failing inside Ray's restore."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vacsr.atomic import atomic_write_json
from vacsr.errors import ConfigError

if TYPE_CHECKING:
    from vacsr.records.tracker import MlflowTracker

FORMAT = 3  # the record format this vacsr writes and resumes
# the types each recorded field may hold (a field not yet written is absent)
DATASETS, AVERAGES = "datasets", "averages"  # the sections that record runs, by name
TOP_FIELDS = {"format": int, DATASETS: dict, AVERAGES: dict, "settings": dict,
              "parent_run_id": str, "parent_run_key": str, "concurrent_trials": int}
DATASET_FIELDS = {"run_id": str, "run_key": str, "done": bool, "result": dict,
                  "failed": (str, type(None))}


def _shape_error(data: Any) -> str | None:
    """What is wrong with a state's shape, in a few words; None when it is right."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key, kind in TOP_FIELDS.items():
        if key in data and not isinstance(data[key], kind):
            return f"'{key}' is a {type(data[key]).__name__}"
    for section in (DATASETS, AVERAGES):
        for name, entry in data.get(section, {}).items():
            if not isinstance(entry, dict):
                return f"{section[:-1]} '{name}' is a {type(entry).__name__}"
            for key, kind in DATASET_FIELDS.items():
                if key in entry and not isinstance(entry[key], kind):
                    return f"'{name}.{key}' is a {type(entry[key]).__name__}"
            if entry.get("done") and not isinstance(entry.get("result", {}).get("per_seed"),
                                                    list):
                return f"{section[:-1]} '{name}' is done without its per-seed results"
    return None


class SweepState:
    def __init__(self, path: Path, fresh: bool) -> None:
        self.path = path
        self.data: dict[str, Any] = {"format": FORMAT}  # a new state is of this vacsr's format
        if not fresh and path.is_file():
            try:
                self.data = json.loads(path.read_text())
            except (ValueError, UnicodeDecodeError):
                raise ConfigError(f"{path}: not valid JSON; remove it to start the sweep "
                                  "afresh") from None
            wrong = _shape_error(self.data)
            if wrong:
                raise ConfigError(f"{path}: not a sweep state ({wrong}); restore the file the "
                                  "driver wrote, or start a new sweep with another --name")
        self.data.setdefault(DATASETS, {})

    def check_format(self) -> None:
        """ConfigError (one line) when the state is not of the record format this vacsr
        resumes: the folder's Tune and Optuna records would not restore."""
        found = self.data.get("format")
        if found is None:
            raise ConfigError(f"{self.path}: written by an older vacsr (before record format "
                              f"{FORMAT}); finish that sweep with the vacsr that started it, or "
                              "start a new sweep with another --name")
        if found != FORMAT:
            raise ConfigError(f"{self.path}: record format {found}, this vacsr resumes format "
                              f"{FORMAT}; finish that sweep with the vacsr that started it, or "
                              "start a new sweep with another --name")

    def dataset(self, name: str) -> dict:
        return self.entry(name)

    def entry(self, name: str | None, section: str = DATASETS) -> dict:
        """The record of `name` in `section` (DATASETS, AVERAGES); the top level for None."""
        return self.data.setdefault(section, {}).setdefault(name, {}) if name else self.data

    def update(self, dataset: str | None = None, section: str = DATASETS, **values: Any) -> None:
        """Change the state (the record of `dataset` in `section`, else the top level) and write
        it in one step."""
        self.entry(dataset, section).update(values)
        atomic_write_json(self.path, self.data)

    def finished(self, datasets: list[str]) -> dict[str, dict]:
        return {d: self.dataset(d)["result"] for d in datasets if self.dataset(d).get("done")}


class StateRunRecord:
    """The run sweep_state.json records for `dataset` in `section` (None: the sweep's own run),
    as the RunRecord of MlflowTracker.start_recorded."""

    def __init__(self, state: SweepState, dataset: str | None, section: str = DATASETS) -> None:
        self.state, self.dataset, self.section = state, dataset, section
        self.id_field, self.key_field = (("run_id", "run_key") if dataset
                                         else ("parent_run_id", "parent_run_key"))

    def recorded(self, tracker: "MlflowTracker", experiment: str) -> tuple[str | None, str | None]:
        entry = self.state.entry(self.dataset, self.section)
        return entry.get(self.id_field) or None, entry.get(self.key_field) or None

    def note_key(self, key: str) -> None:
        self.state.update(self.dataset, section=self.section, **{self.key_field: key})

    def note_run(self, run_id: str, key: str) -> None:
        self.state.update(self.dataset, section=self.section,
                          **{self.id_field: run_id, self.key_field: key})


def start_recorded_run(tracker: "MlflowTracker", state: SweepState, dataset: str | None,
                       experiment: str, run_name: str, section: str = DATASETS,
                       **start: Any) -> str:
    """Start or continue on `tracker` the run sweep_state.json records for `dataset` in
    `section` (None: the sweep's own run), crash-safe (MlflowTracker.start_recorded); returns
    its id. A recorded run the store no longer holds stops the resume in one line."""
    return tracker.start_recorded(StateRunRecord(state, dataset, section), experiment, run_name,
                                  **start)
