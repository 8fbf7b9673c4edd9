"""`vacsr best`: the selected config and metrics per dataset of a sweep, and its table, read back
from the MLflow store alone (the artifacts of vacsr/records/artifacts.py: the sweep run's table
spec, each dataset run's best config, final runs and importance analysis)."""
from __future__ import annotations

from pathlib import Path

import yaml

from vacsr.atomic import atomic_write_bytes, require_writable_folder
from vacsr.errors import ConfigError
from vacsr.records import check_tracking_uri
from vacsr.records.artifacts import (
    BEST_CONFIG,
    FINAL_RUNS,
    IMPORTANCE_DIR,
    IMPORTANCE_FILE,
    SWEEP_INFO,
)
from vacsr.records.sweep_records import (
    DATASET_TAG,
    FAILED_TAG,
    UNFINISHED_STATUSES,
    SweepRecords,
)
from vacsr.records.uri import check_store_exists
from vacsr.records.view import TABLE_PREFIX
from vacsr.results import DIGITS, VAL
from vacsr.sweep.report.importance import Sensitivity, importance_table
from vacsr.sweep.report.table import readable, table_rows, to_markdown
from vacsr.sweep.report.unfinished import notice, read_progress

VAL_COLUMN = f"{TABLE_PREFIX}{VAL}"  # the selection's val metric, shown under its own name

# what `vacsr best` reads: never a store it would create (MLflow makes an empty one, and its
# folder, at any path it is given)
EXISTING_STORE = ("the MLflow store a sweep recorded into (--tracking-uri, else "
                  "$MLFLOW_TRACKING_URI, else ./mlflow.db)")


def read_records(tracking_uri: str | None, experiment: str) -> SweepRecords:
    """The experiment's records in an existing store (checked first, in one line)."""
    uri = check_store_exists(tracking_uri, EXISTING_STORE)
    check_tracking_uri(uri)
    return SweepRecords(uri, experiment)


def sweep_notice(tracking_uri: str | None, experiment: str, sweep: str | None) -> str:
    """The lines the output of an unfinished sweep starts with (vacsr/sweep/report/
    unfinished.py); "" for a finished one."""
    records = read_records(tracking_uri, experiment)
    return notice(read_progress(records, records.sweep_run(sweep)))


def best_configs(tracking_uri: str | None, experiment: str, sweep: str | None,
                 export: Path | None = None) -> list[dict]:
    """Per dataset: its results as text (`_shown_metrics`), the searched keys' selected values
    and the best config (optionally exported as YAML files `vacsr train --config` accepts)."""
    if export is not None:  # a read-only folder fails before any file is written
        require_writable_folder(export, "the exported best configs")
    records = read_records(tracking_uri, experiment)
    rows = []
    for run in records.dataset_runs(records.sweep_run(sweep)):
        dataset = run.data.tags[DATASET_TAG]
        if run.info.status != "FINISHED":
            rows.append({"dataset": dataset, "status": run.info.status, "metrics": {},
                         "params": {}, "config": None, "run_id": run.info.run_id})
            continue
        best_config = records.artifact(run.info.run_id, BEST_CONFIG)
        if export is not None:
            atomic_write_bytes(export / f"{dataset}.yaml", best_config)
        metrics = _shown_metrics(run.data.metrics)
        rows.append({"dataset": dataset, "run_id": run.info.run_id, "status": run.info.status,
                     "metrics": metrics, "params": dict(run.data.params),
                     "config": yaml.safe_load(best_config)})
    return rows


def _shown_metrics(metrics: dict[str, float]) -> dict[str, str]:
    """A dataset run's results as text, in the table's words and digits (base, novel, H, ... from
    the table/* metrics the sweep's end publishes; the table's best val is the selection's),
    then the selection's best_* values (its val metric, trials); a run that ended before the
    table shows these alone."""
    table = {k[len(TABLE_PREFIX):]: f"{v:.{DIGITS}f}" for k, v in sorted(metrics.items())
             if k.startswith(TABLE_PREFIX) and not k.endswith("_std") and k != VAL_COLUMN}
    table = dict(sorted(table.items(), key=lambda kv: kv[0] == "H"))  # the harmonic mean last
    best = {k[len("best_"):]: f"{v:.{DIGITS}f}" if k.startswith("best_val/") else readable(v)
            for k, v in metrics.items() if k.startswith("best_")}  # the val as the table's
    return {**table, **dict(sorted(best.items()))}


def format_rows(rows: list[dict]) -> str:
    """Values rounded for reading (the table's 2 decimals, else 4 significant digits); the
    exported YAML keeps them whole."""
    lines = []
    for row in rows:
        metrics = ", ".join(f"{k}={v}" for k, v in row["metrics"].items())
        chosen = ", ".join(f"{k}={readable(v)}" for k, v in sorted(row["params"].items()))
        lines.append(f"{row['dataset']}  [{row['status']}]\n  metrics: {metrics}\n"
                     f"  config:  {chosen}")
    return "\n".join(lines)


def sweep_table(tracking_uri: str | None, experiment: str, sweep: str | None) -> str:
    """The sweep's final table (mean ± std over seeds), rebuilt from MLflow; a dataset without
    a result yet (sweep_notice names it) is no failure, and no row."""
    records = read_records(tracking_uri, experiment)
    parent = records.sweep_run(sweep)
    info = records.artifact_json(parent.info.run_id, SWEEP_INFO)
    if info is None:
        raise ConfigError(f"sweep run {parent.info.run_id}: no {SWEEP_INFO} artifact (a sweep "
                          "recorded before tables were stored)")
    results, failed = {}, {}
    for run in records.dataset_runs(parent):
        dataset = run.data.tags[DATASET_TAG]
        if run.info.status in UNFINISHED_STATUSES:
            continue
        finals = records.artifact_json(run.info.run_id, FINAL_RUNS)
        if finals is None:
            failed[dataset] = run.data.tags.get(FAILED_TAG) or f"run {run.info.status}"
            continue
        results[dataset] = {"per_seed": finals["per_seed"],
                            "val": run.data.metrics.get(f"best_{info['metric']}", float("nan"))}
    return to_markdown(info["table"], table_rows(info["table"], results, failed))


def sweep_importance(tracking_uri: str | None, experiment: str, sweep: str | None) -> str:
    """The per-dataset importance table (searched keys x datasets), from the importance.json each
    dataset run holds in MLflow."""
    records = read_records(tracking_uri, experiment)
    analyses = []
    for run in records.dataset_runs(records.sweep_run(sweep)):
        payload = records.artifact_json(run.info.run_id, f"{IMPORTANCE_DIR}/{IMPORTANCE_FILE}")
        if payload is not None:
            analyses.append(Sensitivity.from_json(payload))
    return importance_table(analyses)
