"""Which trial a dataset's search selects (paper sec. 4.1, appendix C: on the validation split
only), as a pure function of the trials' results.

The order is total and does not depend on how Tune lists its trials (a restored experiment lists
them in another order): the best last-reported val metric, then, on a tie, the trial that
started first, as recorded by `TrialOrder` in `trials/<dataset>/trial_order.json` of the sweep
folder, then the trial id. A resumed sweep therefore selects exactly what an uninterrupted one
selects.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ray import tune

from vacsr.atomic import atomic_write_json
from vacsr.errors import VacsrError

ORDER_FILE = "trial_order.json"


class DatasetFailed(VacsrError):
    """No trial of a dataset finished with its selection metric."""


def read_trial_order(path: Path) -> dict[str, int]:
    """trial id -> the position it started in; empty when nothing was recorded."""
    try:
        order = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in order.items()} if isinstance(order, dict) else {}


class TrialOrder(tune.Callback):
    """Records each trial's id when it first starts, with the next free position. Kept in the
    sweep folder, not in the callback (Tune pickles callbacks into its experiment state, which a
    stopped driver may have saved before the last trial started)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        order = read_trial_order(self.path)
        if trial.trial_id not in order:
            order[trial.trial_id] = max(order.values(), default=-1) + 1
            atomic_write_json(self.path, order)


def select_best(trials: list[dict], metric: str, mode: str = "max") -> dict:
    """The trial whose last reported `metric` (a val metric) is best; test metrics never count.
    A tie goes to the trial with the lower `order` (it started first), then the lower
    `trial_id`, whatever the list's order. Failed trials and trials without the metric are
    skipped."""
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
    # min over (-value, order, id): best value first, then the earliest start, then the id
    return min(scored, key=lambda t: (-sign * t["metrics"][metric],
                                      t.get("order", math.inf), str(t.get("trial_id", ""))))
