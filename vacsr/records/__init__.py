"""MLflow tracking: the only library package that imports mlflow (the library core never does).

- `uri`: `resolve_tracking_uri` / `check_tracking_uri` pick the store (SQLite next to the runs by
  default) and fail fast with a one-line ConfigError before any training starts.
- `run`: `MlflowTracker`, one MLflow run driven through `MlflowClient` and its run id.
- `callback`: `TrackingCallback`, the picklable per-epoch callback for `Trainer.fit(callbacks=...)`.

Layout in MLflow: one experiment per sweep kind, tagged as a model-training experiment so the UI
opens on its runs; a parent run per sweep, a child run per dataset and a child per trial (tag
`mlflow.parentRunId`); params = the flattened config; metrics per epoch with step = epoch number
(1-based, the "epoch" entry of the history); `best_*` metrics at the end.
"""
from vacsr.records.callback import RUN_STATE_FILE, TrackingCallback, best_entry
from vacsr.records.tracker import (
    ARTIFACTS_DIR, EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, MAX_KEY_LENGTH, MAX_METRICS_PER_BATCH,
    MAX_PARAM_VALUE_LENGTH, MAX_PARAMS_PER_BATCH, PARAMS_CHANGED_TAG, PARENT_TAG, RUN_KEY_TAG,
    MlflowTracker, metric_name, new_run_key, numeric_metrics, param_value,
)
from vacsr.records.uri import (
    DB_NAME, DB_PORTS, TRACKING_URI_ENV, check_tracking_uri, redact_uri, resolve_tracking_uri,
    sqlite_path,
)

__all__ = [
    "ARTIFACTS_DIR", "DB_NAME", "DB_PORTS", "EXPERIMENT_KIND", "EXPERIMENT_KIND_TAG",
    "MAX_KEY_LENGTH", "MAX_METRICS_PER_BATCH", "MAX_PARAM_VALUE_LENGTH", "MAX_PARAMS_PER_BATCH",
    "PARAMS_CHANGED_TAG", "PARENT_TAG", "RUN_KEY_TAG", "RUN_STATE_FILE", "TRACKING_URI_ENV",
    "MlflowTracker", "TrackingCallback", "best_entry", "check_tracking_uri", "metric_name",
    "new_run_key", "numeric_metrics", "param_value", "redact_uri", "resolve_tracking_uri",
    "sqlite_path",
]
