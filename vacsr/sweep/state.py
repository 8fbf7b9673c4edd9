"""sweep_state.json: what a restarted driver (`--resume`) needs beyond Tune's experiment folders
and the Optuna study: the MLflow run ids and each finished dataset's per-seed results.

Only the driver's main thread changes and writes it (datasets report back to it), so no lock."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vacsr.atomic import atomic_write_json
from vacsr.errors import ConfigError


class SweepState:
    def __init__(self, path: Path, fresh: bool) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        if not fresh and path.is_file():
            try:
                self.data = json.loads(path.read_text())
            except ValueError:
                raise ConfigError(f"{path}: not valid JSON; remove it to start the sweep "
                                  "afresh") from None
        self.data.setdefault("datasets", {})

    def dataset(self, name: str) -> dict:
        return self.data["datasets"].setdefault(name, {})

    def update(self, dataset: str | None = None, **values: Any) -> None:
        """Change the state and write it in one step."""
        (self.dataset(dataset) if dataset else self.data).update(values)
        atomic_write_json(self.path, self.data)

    def finished(self, datasets: list[str]) -> dict[str, dict]:
        return {d: self.dataset(d)["result"] for d in datasets if self.dataset(d).get("done")}
