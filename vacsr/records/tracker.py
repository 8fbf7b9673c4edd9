"""One MLflow run, driven through `MlflowClient` and its run id, never the fluent global "active
run", so a sweep can hold a parent, per-dataset children and trials in one process.

Metric logging is idempotent per (metric, epoch), param logging per key: a resumed run never
repeats or loses an epoch and never trips over MLflow's refusal to change a param.
"""
from __future__ import annotations

import logging
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from vacsr.config import Config, public_dict, save_config
from vacsr.errors import ConfigError
from vacsr.paths import absolute_path
from vacsr.records.client import HeldClient, client_uri
from vacsr.records.client_settings import apply_client_settings
from vacsr.records.conflicts import retry_store_creation
from vacsr.records.names import (
    ARTIFACTS_DIR,
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_PER_BATCH,
    PARAMS_CHANGED_TAG,
    PARENT_TAG,
    RUN_KEY_TAG,
    chunks,
    metric_name,
    new_run_key,
    numeric_metrics,
    param_value,
)
from vacsr.records.uri import (
    redact_uri,
    resolve_tracking_uri,
    sqlite_path,
    store_creation_lock,
)
from vacsr.train.run_files import CONFIG_FILE

log = logging.getLogger(__name__)


class RunRecord(Protocol):
    """Where a run's owner records the run (a training folder's mlflow_run.json, the sweep's
    sweep_state.json): its key before MLflow creates the run, its id after."""

    def recorded(self, tracker: "MlflowTracker", experiment: str) -> tuple[str | None, str | None]:
        """(run id, run key) as recorded, either None when not recorded."""

    def note_key(self, key: str) -> None:
        """Record the key of a run about to be created."""

    def note_run(self, run_id: str, key: str) -> None:
        """Record the run's id (with its key)."""


def open_tracker(tracking_uri: str | None = None, run_id: str | None = None) -> "MlflowTracker":
    """A tracker on the store at `tracking_uri`, the one way vacsr's records open one: holding no
    run (the store's experiments, and runs addressed by id), or continuing `run_id` (its status
    back to RUNNING)."""
    tracker = MlflowTracker(tracking_uri)
    if run_id is not None:
        tracker.resume(run_id)
    return tracker


# ---------------------------------------------------------------- one MLflow run
class MlflowTracker:
    """One MLflow run, addressed by run id through its own MlflowClient.

    `with MlflowTracker(uri) as tracker: tracker.start(...)` ends the run FINISHED, or FAILED
    (KILLED on Ctrl-C) when the block raises.
    """

    def __init__(self, tracking_uri: str | None = None, *, default_dir: str | Path = ".") -> None:
        self.tracking_uri = resolve_tracking_uri(tracking_uri, default_dir)
        apply_client_settings()  # bounded retries, quiet store notes (records/client_settings.py)
        with store_creation_lock(self.tracking_uri):  # the client creates a new store
            self.client = HeldClient(retry_store_creation(
                MlflowClient, tracking_uri=client_uri(self.tracking_uri)))
        self.run_id: str | None = None
        self._read_store = False  # the run may hold data this tracker did not log itself
        self._steps: dict[str, set[int]] = {}  # metric -> steps known to be in the run
        self._params: dict[str, str] | None = None  # params known to be in the run
        self._changed: set[str] = set()  # param keys whose later values were not kept

    def __enter__(self) -> "MlflowTracker":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish("FINISHED")
        else:
            self.finish("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")
        return False

    # ------------------------------------------------------------ lifecycle
    def start(self, experiment: str, run_name: str, *, parent_run_id: str | None = None,
              tags: Mapping[str, Any] | None = None, run_id: str | None = None,
              run_key: str | None = None) -> str:
        """Create a run in `experiment` (created if missing), tagged with `run_key` when given
        (see RUN_KEY_TAG), or resume `run_id`; return its id."""
        if self.run_id is not None:
            raise RuntimeError(f"tracker already holds run {self.run_id}; finish() it first")
        all_tags = {k: str(v) for k, v in (tags or {}).items()}
        if parent_run_id:
            all_tags[PARENT_TAG] = parent_run_id
        if run_key is not None:
            all_tags[RUN_KEY_TAG] = run_key
        if run_id is not None:
            return self.resume(run_id, tags=all_tags)
        run = self.client.create_run(self.experiment_id(experiment), run_name=run_name,
                                     tags=all_tags)
        self._attach(run.info.run_id, read_store=False)
        return self.run_id

    def resume(self, run_id: str, *, tags: Mapping[str, Any] | None = None) -> str:
        """Continue the existing run `run_id` (status back to RUNNING); return its id."""
        if self.run_id is not None:
            raise RuntimeError(f"tracker already holds run {self.run_id}; finish() it first")
        if not self.run_exists(run_id):
            raise ConfigError(f"MLflow run {run_id} not found in {redact_uri(self.tracking_uri)}")
        self._attach(run_id, read_store=True)
        self.client.update_run(run_id, status="RUNNING")
        if tags:
            self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
        return run_id

    def start_recorded(self, record: RunRecord, experiment: str, run_name: str, *,
                       restart_lost: bool = False, **start: Any) -> str:
        """Start or continue the run `record` names, crash-safe: the key is recorded before MLflow
        creates the run and the id after, so an owner killed between the two finds the run by
        its key when it restarts instead of opening a second one beside it. A recorded id the
        store no longer holds (a reset store, a deleted run) starts afresh with `restart_lost`;
        otherwise continuing it fails in one line. `start`: `start`'s keywords."""
        run_id, key = record.recorded(self, experiment)
        if run_id is not None and restart_lost and not self.run_exists(run_id):
            run_id = None
        if run_id is None and key is not None:  # a start killed before it recorded the id
            run_id = self.find_run(experiment, key)
        if key is None:
            key = new_run_key()
            if run_id is None:  # the key before the run: see RUN_KEY_TAG
                record.note_key(key)
        run_id = self.start(experiment, run_name, run_id=run_id, run_key=key, **start)
        record.note_run(run_id, key)
        return run_id

    def _attach(self, run_id: str, *, read_store: bool) -> None:
        self.run_id, self._read_store = run_id, read_store
        self._steps, self._params, self._changed = {}, None, set()

    def run_exists(self, run_id: str) -> bool:
        """True when `run_id` is a live (not deleted) run of this store."""
        try:
            return self.client.get_run(run_id).info.lifecycle_stage != "deleted"
        except MlflowException:
            return False

    def find_run(self, experiment: str, run_key: str) -> str | None:
        """The live run of `experiment` tagged with `run_key`, if MLflow holds one."""
        if not re.fullmatch(r"[0-9a-f]+", run_key):
            raise ValueError(f"run key {run_key!r}: expected lowercase hex (uuid4().hex)")
        runs = self.client.search_runs([self.experiment_id(experiment)],
                                       filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'",
                                       max_results=1)
        return runs[0].info.run_id if runs else None

    def experiment_id(self, name: str) -> str:
        """Id of experiment `name`, created (or restored) if needed; safe against a racing trial.
        An experiment without a kind gets the model-training kind, so the UI opens on its runs;
        a kind someone chose is left alone."""
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return self.client.create_experiment(
                    name, artifact_location=self._artifact_root(name),
                    tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
            except MlflowException:  # another process created it first
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage == "deleted":
            self.client.restore_experiment(experiment.experiment_id)
        if EXPERIMENT_KIND_TAG not in experiment.tags:
            self.client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG,
                                           EXPERIMENT_KIND)
        return experiment.experiment_id

    def _artifact_root(self, experiment: str) -> str | None:
        """SQLite store: artifacts next to the database, absolute (MLflow's default "./mlruns"
        follows the working directory, which Ray moves). Servers choose their own location."""
        db = sqlite_path(self.tracking_uri)
        if db is None:
            return None
        slug = re.sub(r"[^\w.\-]", "_", experiment).strip(".") or "experiment"
        return (absolute_path(db).parent / ARTIFACTS_DIR / slug).as_uri()

    def finish(self, status: str = "FINISHED") -> None:
        """End the run with `status`; a no-op when no run is held."""
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status)
            self.run_id = None

    def _require_run(self) -> str:
        if self.run_id is None:
            raise RuntimeError("no MLflow run: call start() first")
        return self.run_id

    def set_tag(self, key: str, value: Any) -> None:
        self.client.set_tag(self._require_run(), key, str(value))

    # ------------------------------------------------------------ params
    def log_params(self, params: Mapping[str, Any]) -> list[str]:
        """Log the params not yet in the run. MLflow refuses to change a param, so an equal value
        is skipped and a different one keeps the first: those keys are warned about, listed in
        tag `vacsr.params_changed_on_resume` and returned."""
        run_id = self._require_run()
        if self._params is None:  # read once: this tracker logs every later param itself
            self._params = dict(self.client.get_run(run_id).data.params) if self._read_store else {}
        values = {metric_name(k): param_value(v) for k, v in params.items()}
        new = [Param(k, v) for k, v in values.items() if k not in self._params]
        for chunk in chunks(new, MAX_PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=chunk)
        self._params.update((p.key, p.value) for p in new)
        changed = sorted(k for k, v in values.items() if self._params[k] != v)
        if changed:
            log.warning("MLflow run %s already holds params %s with other values; the params keep "
                        "the first values", run_id, ", ".join(changed))
            self._changed.update(changed)
            self.client.set_tag(run_id, PARAMS_CHANGED_TAG, ",".join(sorted(self._changed)))
        return changed

    def log_config(self, config: Config) -> None:
        """Params = the flattened config, a password in tracking.uri as `***` (see log_params:
        a resumed run keeps its first values); also the resolved config as artifact
        `config.yaml`, the run's only copy of it."""
        self.log_params({f"{section}.{key}": value
                         for section, values in public_dict(config).items()
                         for key, value in values.items()})
        with tempfile.TemporaryDirectory() as tmp:
            save_config(config, Path(tmp) / CONFIG_FILE)
            self.client.log_artifact(self._require_run(), str(Path(tmp) / CONFIG_FILE))

    # ------------------------------------------------------------ metrics
    def _logged_steps(self, key: str) -> set[int]:
        """Steps of `key` already in the run: read once per key unless this tracker created the
        run and so logged all of it itself."""
        if key not in self._steps:
            history = self.client.get_metric_history(self.run_id, key) if self._read_store else []
            self._steps[key] = {int(m.step) for m in history}
        return self._steps[key]

    def _log_new(self, metrics: Mapping[str, float], step: int) -> int:
        """Log the (metric, step) pairs not yet in the run; return how many were logged."""
        run_id, now = self._require_run(), int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in metrics.items()
                 if step not in self._logged_steps(k)]
        for chunk in chunks(batch, MAX_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=chunk)
        for metric in batch:
            self._steps[metric.key].add(step)
        return len(batch)

    def log_epoch(self, epoch: int, metrics: Mapping[str, Any]) -> int:
        """Log the numeric entries of one epoch's metrics at step `epoch` (1-based, as the
        history's "epoch" entry). Pairs already logged are skipped; returns how many were new."""
        values = numeric_metrics({k: v for k, v in metrics.items() if k != "epoch"})
        return self._log_new(values, int(epoch))

    def sync_history(self, history: Sequence[Mapping[str, Any]]) -> list[int]:
        """Log the epochs of `history` (entries with an "epoch" key) missing from the run, e.g.
        after a crash between a checkpoint and its logging. Returns the epochs that got metrics.
        Reads the run's metric steps afresh: copies of a callback in other processes (Ray
        workers) may have logged to the same run since this tracker last looked."""
        self._read_store, self._steps = True, {}
        synced = []
        for index, entry in enumerate(history):
            if "epoch" not in entry:
                raise ValueError(f"history[{index}] has no 'epoch' entry")
            if self.log_epoch(int(entry["epoch"]), entry):
                synced.append(int(entry["epoch"]))
        return synced

    def log_values(self, metrics: Mapping[str, Any], step: int = 0) -> int:
        """Log summary values (not per epoch) under their own names at `step`; pairs already
        logged are skipped. Returns how many were new."""
        return self._log_new(numeric_metrics(metrics), int(step))

    def log_best(self, metrics: Mapping[str, Any], step: int = 0) -> None:
        """Log `metrics` as `best_<name>`: search_runs compares a metric's latest value, so the
        best epoch's values must be logged last under their own names."""
        values = numeric_metrics({f"best_{k}": v for k, v in metrics.items()})
        self._log_new(values, int(step))

    # ------------------------------------------------------------ artifacts
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self._require_run(), str(path), artifact_path)

    def log_json(self, name: str, payload: Mapping[str, Any]) -> None:
        self.client.log_dict(self._require_run(), dict(payload), name)

    def log_figure(self, fig, name: str) -> None:
        """Log a matplotlib figure as artifact `name` (e.g. "plots/curves.png")."""
        self.client.log_figure(self._require_run(), fig, name)
