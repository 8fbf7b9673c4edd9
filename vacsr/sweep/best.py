"""`vacsr best`: the best config and metrics per dataset of a sweep, read back from MLflow."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from vacsr.errors import ConfigError
from vacsr.tracking import MlflowTracker, check_tracking_uri, resolve_tracking_uri


def find_sweep_run(tracker: MlflowTracker, experiment: str, sweep: str | None):
    """The sweep's parent run (the newest one when `sweep` is None)."""
    found = tracker.client.get_experiment_by_name(experiment)
    if found is None:
        raise ConfigError(f"MLflow experiment {experiment!r} not found in {tracker.tracking_uri}")
    query = "tags.`vacsr.kind` != ''" + (f" and tags.`vacsr.sweep` = '{sweep}'" if sweep else "")
    runs = tracker.client.search_runs([found.experiment_id], filter_string=query,
                                      order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise ConfigError(f"no sweep {sweep or ''} in experiment {experiment!r}".replace("  ", " "))
    return runs[0]


def dataset_runs(tracker: MlflowTracker, parent) -> list:
    return tracker.client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' "
                      "and tags.`vacsr.dataset` != ''",
        order_by=["attributes.start_time ASC"])


def best_configs(tracking_uri: str | None, experiment: str, sweep: str | None,
                 export: Path | None = None) -> list[dict]:
    """Per dataset: best_* metrics and the best config (optionally exported as YAML files)."""
    uri = resolve_tracking_uri(tracking_uri)
    check_tracking_uri(uri)
    tracker = MlflowTracker(uri)
    parent = find_sweep_run(tracker, experiment, sweep)
    rows = []
    for run in dataset_runs(tracker, parent):
        dataset = run.data.tags["vacsr.dataset"]
        local = tracker.client.download_artifacts(run.info.run_id, "best_config.yaml")
        config = yaml.safe_load(Path(local).read_text())
        if export is not None:
            export.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, export / f"{dataset}.yaml")
        metrics = {k[len("best_"):]: v for k, v in run.data.metrics.items() if k.startswith("best_")}
        rows.append({"dataset": dataset, "run_id": run.info.run_id, "status": run.info.status,
                     "metrics": metrics, "config": config})
    return rows


SEARCHED = ("loss.alpha_kl", "loss.beta", "loss.gamma", "adapter.num_components",
            "loss.num_hard_negatives", "model.trainable_image_blocks",
            "model.trainable_text_blocks", "train.epochs", "train.batch_size", "optim.lr")


def format_rows(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        metrics = ", ".join(f"{k}={v:.3g}" for k, v in sorted(row["metrics"].items()))
        config = row["config"]
        chosen = ", ".join(f"{key}={config[key.split('.')[0]][key.split('.')[1]]}"
                           for key in SEARCHED
                           if key.split(".")[1] in config.get(key.split(".")[0], {}))
        lines.append(f"{row['dataset']}  [{row['status']}]\n  metrics: {metrics}\n"
                     f"  config:  {chosen}")
    return "\n".join(lines)
