"""`vacsr best`: the selected config and metrics per dataset of a sweep, and its table, read back
from the MLflow store alone (the parent run's sweep.json and each dataset run's final_runs.json)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from vacsr.atomic import atomic_write_bytes, require_writable_folder
from vacsr.errors import ConfigError
from vacsr.sweep.report.importance import FOLDER, Sensitivity, importance_table
from vacsr.sweep.report.table import readable, table_rows, to_markdown
from vacsr.records import MlflowTracker, check_tracking_uri, redact_uri
from vacsr.records.uri import check_store_exists


def find_sweep_run(tracker: MlflowTracker, experiment: str, sweep: str | None):
    """The sweep's parent run (the newest one when `sweep` is None)."""
    found = tracker.client.get_experiment_by_name(experiment)
    if found is None:
        raise ConfigError(f"MLflow experiment {experiment!r} not found in "
                          f"{redact_uri(tracker.tracking_uri)}")
    query = "tags.`vacsr.kind` != ''" + (f" and tags.`vacsr.sweep` = '{sweep}'" if sweep else "")
    runs = tracker.client.search_runs([found.experiment_id], filter_string=query,
                                      order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise ConfigError(" ".join(f"no sweep {sweep or ''} in experiment {experiment!r}".split()))
    return runs[0]


def dataset_runs(tracker: MlflowTracker, parent) -> list:
    return tracker.client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' "
                      "and tags.`vacsr.dataset` != ''",
        order_by=["attributes.start_time ASC"])


# what `vacsr best` reads: never a store it would create (MLflow makes an empty one, and its
# folder, at any path it is given)
EXISTING_STORE = ("the MLflow store a sweep recorded into (--tracking-uri, else "
                  "$MLFLOW_TRACKING_URI, else ./mlflow.db)")


def _tracker(tracking_uri: str | None) -> MlflowTracker:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per file
    uri = check_store_exists(tracking_uri, EXISTING_STORE)
    check_tracking_uri(uri)
    return MlflowTracker(uri)


def _artifact_json(tracker: MlflowTracker, run_id: str, name: str) -> dict | None:
    try:
        return json.loads(Path(tracker.client.download_artifacts(run_id, name)).read_text())
    except Exception:  # absent: the dataset did not finish
        return None


def best_configs(tracking_uri: str | None, experiment: str, sweep: str | None,
                 export: Path | None = None) -> list[dict]:
    """Per dataset: best_* metrics, the searched keys' selected values and the best config
    (optionally exported as YAML files `vacsr train --config` accepts)."""
    if export is not None:  # a read-only folder fails before any file is written
        require_writable_folder(export, "the exported best configs")
    tracker = _tracker(tracking_uri)
    parent = find_sweep_run(tracker, experiment, sweep)
    rows = []
    for run in dataset_runs(tracker, parent):
        dataset = run.data.tags["vacsr.dataset"]
        if run.info.status != "FINISHED":
            rows.append({"dataset": dataset, "status": run.info.status, "metrics": {},
                         "params": {}, "config": None, "run_id": run.info.run_id})
            continue
        local = tracker.client.download_artifacts(run.info.run_id, "best_config.yaml")
        if export is not None:
            atomic_write_bytes(export / f"{dataset}.yaml", Path(local).read_bytes())
        metrics = {k[len("best_"):]: v for k, v in run.data.metrics.items() if k.startswith("best_")}
        rows.append({"dataset": dataset, "run_id": run.info.run_id, "status": run.info.status,
                     "metrics": metrics, "params": dict(run.data.params),
                     "config": yaml.safe_load(Path(local).read_text())})
    return rows


def format_rows(rows: list[dict]) -> str:
    """Values rounded for reading (4 significant digits); the exported YAML keeps them whole."""
    lines = []
    for row in rows:
        metrics = ", ".join(f"{k}={readable(v)}" for k, v in sorted(row["metrics"].items()))
        chosen = ", ".join(f"{k}={readable(v)}" for k, v in sorted(row["params"].items()))
        lines.append(f"{row['dataset']}  [{row['status']}]\n  metrics: {metrics}\n"
                     f"  config:  {chosen}")
    return "\n".join(lines)


def sweep_table(tracking_uri: str | None, experiment: str, sweep: str | None) -> str:
    """The sweep's final table (mean ± std over seeds), rebuilt from MLflow."""
    tracker = _tracker(tracking_uri)
    parent = find_sweep_run(tracker, experiment, sweep)
    info = _artifact_json(tracker, parent.info.run_id, "sweep.json")
    if info is None:
        raise ConfigError(f"sweep run {parent.info.run_id}: no sweep.json artifact (a sweep "
                          "recorded before tables were stored)")
    results, failed = {}, {}
    for run in dataset_runs(tracker, parent):
        dataset = run.data.tags["vacsr.dataset"]
        finals = _artifact_json(tracker, run.info.run_id, "final_runs.json")
        if finals is None:
            failed[dataset] = f"run {run.info.status}"
            continue
        results[dataset] = {"per_seed": finals["per_seed"],
                            "val": run.data.metrics.get(f"best_{info['metric']}", float("nan"))}
    return to_markdown(info["table"], table_rows(info["table"], results, failed))


def sweep_importance(tracking_uri: str | None, experiment: str, sweep: str | None) -> str:
    """The per-dataset importance table (searched keys x datasets), from the importance.json each
    dataset run holds in MLflow."""
    tracker = _tracker(tracking_uri)
    parent = find_sweep_run(tracker, experiment, sweep)
    analyses = []
    for run in dataset_runs(tracker, parent):
        payload = _artifact_json(tracker, run.info.run_id, f"{FOLDER}/importance.json")
        if payload is not None:
            analyses.append(Sensitivity.from_json(payload))
    return importance_table(analyses)
