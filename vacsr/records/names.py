"""The tags, limits and names of vacsr's MLflow runs: what a run is tagged with, and a key or
value as MLflow accepts it."""
from __future__ import annotations

import numbers
import re
import uuid
from collections.abc import Mapping
from typing import Any

ARTIFACTS_DIR = "mlartifacts"  # next to the SQLite file, like `mlflow server`'s default
PARENT_TAG = "mlflow.parentRunId"
PARAMS_CHANGED_TAG = "vacsr.params_changed_on_resume"
# A run's name for its owner, recorded (state file) before MLflow creates the run: a process killed
# after MLflow committed the run but before the owner recorded its id finds the run by this tag
# when it restarts, instead of opening a second one beside it.
RUN_KEY_TAG = "vacsr.run_key"
METHOD_TAG = "vacsr.method"  # every run: the method it runs (its config's adapter.kind)
# every run of a rehearsal (--rehearse, vacsr/sweep/rehearsal/): its time scale; never a result
REHEARSAL_TAG = "vacsr.rehearsal"
# The experiment kind MLflow 3.x's UI reads to choose between its GenAI views (traces) and its
# model-training views (runs, charts). 3.17's UI follows its sidebar switch instead (a link can
# carry `?workflowType=machine_learning`), but the tag still marks what the experiment holds.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# MLflow's limits (mlflow.utils.validation); exceeding them makes log_batch fail.
MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000


_BAD_NAME_CHARS = re.compile(r"[^\w./\- ]")  # MLflow also allows ":" except on Windows


def metric_name(key: Any) -> str:
    """`key` as a name MLflow accepts: allowed characters, no empty, "." or ".." path parts."""
    name = _BAD_NAME_CHARS.sub("_", str(key))
    parts = ["__" if part == ".." else part for part in name.split("/") if part not in ("", ".")]
    return "/".join(parts)[:MAX_KEY_LENGTH].rstrip("/") or "_"


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of `metrics` under sanitised names (bools and strings dropped)."""
    out = {}
    for key, value in metrics.items():
        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # numpy / torch scalar
            value = value.item()
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            out[metric_name(key)] = float(value)
    return out


def param_value(value: Any) -> str:
    """A config value as the string MLflow stores ("None", "[15]"), cut to MLflow's limit."""
    return str(value)[:MAX_PARAM_VALUE_LENGTH]


def chunks(items: list, size: int) -> list[list]:
    """`items` in lists of at most `size`: MLflow's batch limits."""
    return [items[start:start + size] for start in range(0, len(items), size)]


def new_run_key() -> str:
    """A key for RUN_KEY_TAG."""
    return uuid.uuid4().hex
