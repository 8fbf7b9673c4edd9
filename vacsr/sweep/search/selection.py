"""Which trial a dataset's search selects (paper sec. 4.1, appendix C: on the validation split
only), as a pure function of the trials' results, and the record of that choice.

The order is total and depends on nothing that timing decides: the best last-reported val
metric, then, on a tie, the trial the searcher created first (its creation index; the base
config is index 0, see `creation_order`), then the trial id. Once made, the
choice is written to `trials/<dataset>/selection.json` of the sweep folder, and a resumed sweep
reads it back instead of deriving it again.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from vacsr.atomic import atomic_write_json
from vacsr.errors import ConfigError, VacsrError
from vacsr.sweep.plan.folders import SELECTION_FILE

SELECTION_FIELDS = {"trial_id": str, "suggested": dict, "val": (int, float), "num_trials": int,
                    "failed_trials": int, "checkpoint": (str, type(None))}


class DatasetFailed(VacsrError):
    """No trial of a dataset finished with its selection metric."""


def creation_order(storage, study_name: str) -> dict[str, int]:
    """Tune trial id -> its creation index (the searcher tags each Optuna trial with its Tune
    trial and index, vacsr/sweep/search/optuna_searcher.py): a trial continued after a stop on a
    new Optuna trial keeps its index, and a trial that replaces one a stop lost takes the lost
    one's (a study attribute where that one was told before the stop). Optuna's trial number
    where a trial has no index."""
    from vacsr.sweep.search.optuna_searcher import CREATION_ATTR, REPEAT_ATTR, TUNE_TRIAL_ATTR

    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return {}
    order: dict[str, int] = {}
    for trial in storage.get_all_trials(study_id, deepcopy=False):
        trial_id = trial.user_attrs.get(TUNE_TRIAL_ATTR)
        index = trial.user_attrs.get(CREATION_ATTR, trial.number)
        if isinstance(trial_id, str):
            order[trial_id] = min(order.get(trial_id, index), index)
    for key, index in storage.get_study_user_attrs(study_id).items():
        if key.startswith(REPEAT_ATTR):
            order[key.removeprefix(REPEAT_ATTR)] = index
    return order


def select_best(trials: list[dict], metric: str, mode: str = "max") -> dict:
    """The trial whose last reported `metric` (a val metric) is best; test metrics never count.
    A tie goes to the trial with the lower `order` (created first), then the lower `trial_id`,
    whatever the list's order. Failed trials and trials without the metric are skipped."""
    if not metric.startswith("val/"):
        raise ValueError(f"selection must use a val metric, got {metric!r}")
    scored = [t for t in trials if t.get("error") is None
              and isinstance(t.get("metrics", {}).get(metric), (int, float))
              and math.isfinite(t["metrics"][metric])]
    if not scored:
        errors = [t["error"] for t in trials if t.get("error")]
        why = f": {errors[0]}" if errors else ""
        raise DatasetFailed(f"none of {len(trials)} trial(s) reported {metric}"
                            f" ({len(errors)} failed){why}")
    sign = 1 if mode == "max" else -1
    # min over (-value, order, id): best value first, then the earliest created, then the id
    return min(scored, key=lambda t: (-sign * t["metrics"][metric],
                                      t.get("order", math.inf), str(t.get("trial_id", ""))))


def write_selection(folder: Path, selection: dict[str, Any]) -> Path:
    """The dataset's choice, whole or not at all."""
    return atomic_write_json(Path(folder) / SELECTION_FILE, selection)


def read_selection(folder: Path) -> dict[str, Any] | None:
    """The recorded choice; None when none was recorded. A damaged record stops the resume with
    one line: deriving the choice again could pick another trial than the records show."""
    path = Path(folder) / SELECTION_FILE
    if not path.is_file():
        return None
    try:
        selection = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        selection = None
    ok = isinstance(selection, dict) and all(
        isinstance(selection.get(k), kind) and not isinstance(selection.get(k), bool)
        for k, kind in SELECTION_FIELDS.items())
    if not ok:
        raise ConfigError(f"{path}: not a selection record (a JSON object with "
                          f"{', '.join(SELECTION_FIELDS)}); remove it and the dataset's search "
                          "is read again from its trials on --resume")
    return selection
