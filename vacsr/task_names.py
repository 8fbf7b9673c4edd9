"""The tasks a run trains (`data.task`) and what differs between them before any model exists.

Read by the config's validation and the sweep's planning, which must not load the model stack
(torch, open_clip): each task's code is its class in vacsr/tasks.py, named by the same keys.
"""
from __future__ import annotations

from typing import Any

from vacsr.errors import ConfigError

# config values every sweep run of the task sets: classification uses CLIP's pooled features,
# no GPO (paper sec. 3.1)
SWEEP_RUN_SETTINGS: dict[str, dict[str, Any]] = {
    "retrieval": {},
    "classification": {"model.use_gpo": False},
}
TASK_NAMES = tuple(SWEEP_RUN_SETTINGS)
# the tags of the fewest and most images a class of a classification run trained on
# (ClassificationTask.run_tags), named here for the sweep's plan to say them
SHOTS_MIN_TAG, SHOTS_MAX_TAG = "vacsr.shots_min", "vacsr.shots_max"


def unknown_task(name: str) -> ConfigError:
    """The one-line refusal of a `data.task` that names no task (tasks.task_type and
    data.build_splits raise it)."""
    return ConfigError(f"data.task: expected one of {', '.join(TASK_NAMES)}, got {name!r}")
