"""A run's and a sweep's records: the only vacsr package that imports mlflow (the library core,
vacsr.distributed and vacsr.sweep reach MLflow through it; vacsr/sweep/cli.py only checks that
mlflow is installed, without importing it).

- `uri`: `resolve_tracking_uri` / `check_tracking_uri` pick the store (SQLite next to the runs by
  default) and fail fast with a one-line ConfigError before any training starts.
- `tracker`: `MlflowTracker`, one MLflow run driven through `MlflowClient` and its run id;
  `open_tracker`, the one way vacsr makes a tracker (and so a client); `start_recorded`, the one
  crash-safe start of a run (key recorded, run created, id recorded) for every run.
- `names`: the tags of vacsr's runs, MLflow's limits, metric and param names as MLflow takes them.
- `client`: a tracker's MLflow client, its credentials in MLflow's environment variables and
  each call held past a stop signal.
- `logger`: `mlflow_logger(config)`, the opener of a run's MLflow run that a trainer is handed.
- `callback`: `TrackingCallback`, the picklable per-epoch callback for `Trainer.fit(callbacks=...)`;
  its training folder's mlflow_run.json records its run.
- `sweep_records`: `SweepRecords`, what vacsr/sweep does in MLflow (its runs, their children,
  closing what a stop left, reading a sweep back); `place_child_run` for trials and seed runs.
- `sweep_state`: sweep_state.json, which records the sweep's runs and results (format 3).
- `artifacts`: the names of a sweep's artifacts; `view`: the sweep's saved view in the MLflow UI
  (`comparison_view`: a sweep of several methods' comparison);
  `inputs`: a run's datasets as MLflow dataset inputs.

Layout in MLflow: one experiment per sweep kind, tagged as a model-training experiment so the UI
opens on its runs; a parent run per sweep, a child run per dataset and a child per trial (tag
`mlflow.parentRunId`); params = the flattened config; metrics per epoch with step = epoch number
(1-based, the "epoch" entry of the history); `best_*` metrics at the end.

Names are loaded on first use: importing a submodule that needs no MLflow (sweep_state,
artifacts, logger, uri, names) does not import mlflow.
"""
from __future__ import annotations

import importlib

_MODULES = {
    "vacsr.records.callback": ("RUN_STATE_FILE", "TrackingCallback", "best_entry"),
    "vacsr.records.names": (
        "ARTIFACTS_DIR", "EXPERIMENT_KIND", "EXPERIMENT_KIND_TAG", "MAX_KEY_LENGTH",
        "MAX_METRICS_PER_BATCH", "MAX_PARAM_VALUE_LENGTH", "MAX_PARAMS_PER_BATCH",
        "PARAMS_CHANGED_TAG", "PARENT_TAG", "RUN_KEY_TAG", "metric_name", "new_run_key",
        "numeric_metrics", "param_value"),
    "vacsr.records.tracker": ("MlflowTracker", "RunRecord", "open_tracker"),
    "vacsr.records.uri": ("DB_NAME", "DB_PORTS", "TRACKING_URI_ENV", "check_tracking_uri",
                          "redact_uri", "resolve_tracking_uri", "sqlite_path"),
    "vacsr.records.logger": ("mlflow_logger",),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vacsr.records' has no attribute {name!r}")
