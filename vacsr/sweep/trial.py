"""One Tune trial = one Ray Train run of VACSR with the trial's suggested values.

The trial function runs in a Tune trial actor; it gets the dataset's resolved Config as an object
(`tune.with_parameters`), applies the suggested values, builds a TorchTrainer (workers reserved
separately) and forwards each epoch's report to Tune, so ASHA can stop it.

Nothing here imports torch: the trial actor only waits on its Train run (see
vacsr/distributed/train.py), and a trial's start-up is paid ~290 times in a full sweep.
"""
from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.train import UserCallback

from vacsr.config import Config, set_value, validate
from vacsr.distributed.train import build_torch_trainer, raise_if_run_failed

CHECKPOINT_PATH_KEY = "checkpoint_path"  # as Ray's TuneReportCallback names it
REPORTS_FILE = "tune_reports.jsonl"  # in the trial's output folder: its reports, in order


@dataclass(frozen=True)
class TrialMeta:
    """Where a dataset's trials write, and the MLflow run they hang under."""

    dataset: str
    trial_root: str  # local folder: one output folder per trial
    ray_storage: str  # Train checkpoints: a path or a URI
    tracking_uri: str
    experiment: str
    parent_run_id: str


def flatten_nested(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"loss": {"beta": 1}} -> {"loss.beta": 1} (Tune nests dotted keys); dotted keys pass."""
    flat = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_nested(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def with_suggestions(base: Config, suggested: dict[str, Any]) -> Config:
    """A copy of `base` with the suggested values (Tune's trial config), validated."""
    config = copy.deepcopy(base)
    for key, value in flatten_nested(suggested).items():
        set_value(config, key, value)
    return validate(config)


def run_trial(suggested: dict[str, Any], base: Config, meta: TrialMeta) -> None:
    """Tune function trainable: one Ray Train run, reporting every epoch to Tune. A run that
    failed by itself (bad data, a diverged loss) raises here, so the trial ends in ERROR. A trial
    that Tune stops (ASHA) ends with its actor, and its Train run with it: Tune must not reuse
    trial actors (`reuse_actors`, off by default), or a stopped run would train on beside the
    next trial."""
    config = with_suggestions(base, suggested)
    trial_id = tune.get_context().get_trial_id()
    config.train.output_dir = str(Path(meta.trial_root) / trial_id)
    config.train.storage_path = meta.ray_storage
    config.train.eval_test = False  # trials are selected on val; test is for the final runs only
    config.tracking.enabled = True
    config.tracking.uri = meta.tracking_uri
    config.tracking.experiment = meta.experiment
    config.tracking.parent_run_id = meta.parent_run_id
    config.tracking.run_name = f"{meta.dataset}-{trial_id}"
    reports = Path(config.train.output_dir) / REPORTS_FILE
    reports.parent.mkdir(parents=True, exist_ok=True)
    reports.write_text("")  # this run's reports only (a restored trial runs again)
    trainer = build_torch_trainer(config, name=trial_id, callbacks=[FileReports(reports)])
    fit_reporting(trainer, ReportReader(reports))
    raise_if_run_failed(config.train.output_dir)


class FileReports(UserCallback):
    """Runs in the Train controller: each report (rank 0's metrics, with the checkpoint's path as
    Ray's TuneReportCallback adds it) as one JSON line in `path`. TuneReportCallback hands reports
    over through a queue actor, one more Python process (~1.4 CPU-s) per trial; a file will do, as
    the controller runs in the trial actor itself (LeanTorchTrainer)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.node_id = ray.get_runtime_context().get_node_id()

    def after_report(self, run_context, metrics: list[dict], checkpoint) -> None:
        if ray.get_runtime_context().get_node_id() != self.node_id:
            raise RuntimeError("the Train controller runs on another node than its Tune trial; "
                               "its reports cannot reach the trial")
        line = dict(metrics[0])
        if checkpoint:
            line[CHECKPOINT_PATH_KEY] = checkpoint.path
        try:
            with open(self.path, "a") as out:  # ReportReader takes complete lines only
                out.write(json.dumps(line, default=_plain) + "\n")
        except FileNotFoundError:
            pass  # the trial's folder is gone: nobody reads these reports any more


def _plain(value: Any) -> Any:
    """JSON for a metric that is not a Python number (a numpy or torch scalar: its value)."""
    return value.item() if hasattr(value, "item") else str(value)


class ReportReader:
    """The complete lines FileReports appended since the last call, as dicts."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def new(self) -> list[dict]:
        with open(self.path, "rb") as src:
            src.seek(self.offset)
            data = src.read()
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines()]


def fit_reporting(trainer, reader: ReportReader, poll_s: float = 0.2) -> None:
    """`trainer.fit()` in a helper thread while this (the trial's) thread passes every report on
    to Tune, in order; the run's error, if any, is raised here after the last report."""
    outcome: dict[str, BaseException] = {}

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # re-raised in the trial's thread
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="vacsr-train-run", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(timeout=poll_s)
        for metrics in reader.new():
            tune.report(metrics)
    for metrics in reader.new():
        tune.report(metrics)
    if "error" in outcome:
        raise outcome["error"]
