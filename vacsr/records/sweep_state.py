"""sweep_state.json: what a restarted driver (`--resume`) needs beyond Tune's experiment folders
and the Optuna study: the MLflow run ids and each finished dataset's per-seed results.

Only the driver's main thread changes and writes it (datasets report back to it), so no lock.
A file of another shape (edited by hand, or not this file at all) stops the resume with one
line: read as empty, it would make the resume open every MLflow run a second time."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vacsr.atomic import atomic_write_json
from vacsr.errors import ConfigError

# the types each recorded field may hold (a field not yet written is absent)
TOP_FIELDS = {"datasets": dict, "settings": dict, "parent_run_id": str, "parent_run_key": str}
DATASET_FIELDS = {"run_id": str, "run_key": str, "done": bool, "result": dict,
                  "failed": (str, type(None))}


def _shape_error(data: Any) -> str | None:
    """What is wrong with a state's shape, in a few words; None when it is right."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key, kind in TOP_FIELDS.items():
        if key in data and not isinstance(data[key], kind):
            return f"'{key}' is a {type(data[key]).__name__}"
    for name, entry in data.get("datasets", {}).items():
        if not isinstance(entry, dict):
            return f"dataset '{name}' is a {type(entry).__name__}"
        for key, kind in DATASET_FIELDS.items():
            if key in entry and not isinstance(entry[key], kind):
                return f"'{name}.{key}' is a {type(entry[key]).__name__}"
        if entry.get("done") and not isinstance(entry.get("result", {}).get("per_seed"), list):
            return f"dataset '{name}' is done without its per-seed results"
    return None


class SweepState:
    def __init__(self, path: Path, fresh: bool) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
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
        self.data.setdefault("datasets", {})

    def dataset(self, name: str) -> dict:
        return self.data["datasets"].setdefault(name, {})

    def update(self, dataset: str | None = None, **values: Any) -> None:
        """Change the state and write it in one step."""
        (self.dataset(dataset) if dataset else self.data).update(values)
        atomic_write_json(self.path, self.data)

    def finished(self, datasets: list[str]) -> dict[str, dict]:
        return {d: self.dataset(d)["result"] for d in datasets if self.dataset(d).get("done")}
