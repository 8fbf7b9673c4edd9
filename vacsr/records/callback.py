"""The per-epoch training callback and the run-state file that lets a resumed training continue
its MLflow run instead of starting a second one beside it."""
from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vacsr.atomic import atomic_write_json
from vacsr.config import Config
from vacsr.errors import ConfigError
from vacsr.paths import absolute_path
from vacsr.plots import plot_training_curves
from vacsr.records.names import METHOD_TAG, RUN_KEY_TAG
from vacsr.records.tracker import MlflowTracker, open_tracker
from vacsr.records.uri import check_tracking_uri, redact_uri, resolve_tracking_uri
from vacsr.train.run_files import METRICS_FILE

RUN_STATE_FILE = "mlflow_run.json"  # in a training output_dir: the run a resumed training continues


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def best_entry(history: Sequence[Mapping[str, Any]], metric: str | None,
               mode: str = "max") -> Mapping[str, Any]:
    """The epoch entry with the best finite `metric`; the last entry when `metric` is None or
    never logged (the final metrics then stand for the run)."""
    scored = [h for h in history if metric is not None and _finite(h.get(metric))]
    if not scored:
        return history[-1] if history else {}
    pick = max if mode == "max" else min
    return pick(scored, key=lambda h: h[metric])


class TrackingCallback:
    """Per-epoch MLflow logging for `Trainer.fit(callbacks=(callback,))`, then `finish(...)`.

    Build it with `TrackingCallback.start(config, experiment=...)` in the driver: the run is
    created (or resumed) there, and the callback carries only plain data (URI, run id, paths), so
    it pickles into Ray workers, each of which attaches its own client to the same run.
    """

    def __init__(self, tracking_uri: str, run_id: str, output_dir: str | Path, *,
                 metric: str | None = None, mode: str = "max") -> None:
        if mode not in ("max", "min"):
            raise ConfigError(f"tracking mode: expected max or min, got {mode!r}")
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.output_dir = str(absolute_path(output_dir))
        self.metric = metric
        self.mode = mode
        self._tracker: MlflowTracker | None = None
        self._ended = False  # finish() or fail() ran in this process: never reopen the run

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tracker": None}  # clients hold DB engines: rebuilt per process

    @classmethod
    def start(cls, config: Config, *, experiment: str, run_name: str | None = None,
              tracking_uri: str | None = None, parent_run_id: str | None = None,
              tags: Mapping[str, Any] | None = None, metric: str | None = None,
              mode: str = "max", resume: bool | None = None) -> "TrackingCallback":
        """Check the store, then create the run (or, when resuming — `resume`, default
        `config.train.resume` — and the output folder names one, continue that run: see
        MlflowTracker.start_recorded) and log the config. Writes output_dir/mlflow_run.json."""
        uri = resolve_tracking_uri(tracking_uri)
        check_tracking_uri(uri)
        output_dir = absolute_path(config.train.output_dir)
        resume = config.train.resume if resume is None else resume
        tracker = open_tracker(uri)
        # the run's id is recorded before its config is logged: a process killed while the
        # config is being logged leaves a run that its restart continues, not an orphan
        run_id = tracker.start_recorded(
            FolderRecord(output_dir, uri, experiment, resume), experiment,
            run_name or output_dir.name, restart_lost=True, parent_run_id=parent_run_id,
            tags={"vacsr.output_dir": str(output_dir), METHOD_TAG: config.adapter.kind,
                  **(tags or {})})
        tracker.log_config(config)
        callback = cls(uri, run_id, output_dir, metric=metric, mode=mode)
        callback._tracker = tracker
        return callback

    @classmethod
    def from_config(cls, config: Config, *, resume: bool | None = None,
                    tags: Mapping[str, Any] | None = None) -> "TrackingCallback":
        """`start` with the run's place in MLflow as `config.tracking` names it (experiment, run
        name, store, parent run): the one way a local run, a Ray Train worker and a sweep's final
        run open their MLflow run."""
        tracking = config.tracking
        return cls.start(config, experiment=tracking.experiment, run_name=tracking.run_name,
                         tracking_uri=tracking.uri, parent_run_id=tracking.parent_run_id,
                         tags=tags, resume=resume)

    def tracker(self) -> MlflowTracker:
        """This process's tracker, attached to the run on first use."""
        if self._ended:
            raise RuntimeError(f"MLflow run {self.run_id} already ended by this callback")
        if self._tracker is None:
            self._tracker = open_tracker(self.tracking_uri, self.run_id)
        return self._tracker

    def __call__(self, epoch: int, metrics: Mapping[str, Any], checkpoint_path: Path) -> None:
        # Step = 1-based epoch number, the same as the history's "epoch" entry.
        self.tracker().log_epoch(int(metrics.get("epoch", epoch + 1)), metrics)

    def finish(self, result, output_dir: str | Path | None = None) -> None:
        """After `fit`: fill any epoch missing from the run, log metrics.json, the training curves
        and the best epoch's metrics as `best_*`, then end the run FINISHED (its config.yaml was
        logged when it started). `result` is a TrainResult (its `history` and `final_metrics`
        are used)."""
        tracker, folder = self.tracker(), Path(output_dir or self.output_dir)
        history = list(result.history)
        tracker.sync_history(history)
        if (folder / METRICS_FILE).is_file():
            tracker.log_artifact(folder / METRICS_FILE)
        else:
            tracker.log_json(METRICS_FILE, {"final": result.final_metrics, "history": history})
        with tempfile.TemporaryDirectory() as tmp:
            tracker.log_artifact(plot_training_curves(history, Path(tmp) / "training_curves.png"),
                                 "plots")
        last_epoch = int(history[-1]["epoch"]) if history else 0
        tracker.log_best(best_entry(history, self.metric, self.mode), step=last_epoch)
        tracker.finish("FINISHED")
        self._ended = True

    def fail(self, status: str = "FAILED") -> None:
        """End the run as FAILED (or KILLED) when training raised; a no-op once ended."""
        if not self._ended:
            self.tracker().finish(status)
            self._ended = True


@dataclass(frozen=True)
class FolderRecord:
    """A training folder's mlflow_run.json as the record of its run (a RunRecord): what a
    previous start wrote for this store, read only when the training resumes."""

    output_dir: Path
    tracking_uri: str
    experiment: str
    resume: bool

    def recorded(self, tracker: MlflowTracker, experiment: str) -> tuple[str | None, str | None]:
        if not self.resume:
            return None, None
        state = _stored_run_state(self.output_dir, self.tracking_uri)
        if state.get("damaged"):  # the record is lost, the run is not
            return _run_of_folder(tracker, experiment, self.output_dir)
        return state.get("run_id"), state.get("run_key")

    def _place(self) -> dict:
        return {"tracking_uri": redact_uri(self.tracking_uri), "experiment": self.experiment}

    def note_key(self, key: str) -> None:
        _write_run_state(self.output_dir, {"run_key": key, **self._place()})

    def note_run(self, run_id: str, key: str) -> None:
        _write_run_state(self.output_dir, {"run_id": run_id, "run_key": key, **self._place()})


def _stored_run_state(output_dir: Path, tracking_uri: str) -> dict:
    """What a previous start wrote for this output folder and store (its run's key, then also
    its id); empty when nothing was written or it was for another store, {"damaged": True}
    when a file is there that is not such a record."""
    path = output_dir / RUN_STATE_FILE
    if not path.is_file():
        return {}
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {"damaged": True}
    if not isinstance(state, dict) or not isinstance(state.get("run_key", ""), str) \
            or not isinstance(state.get("run_id", ""), str):
        return {"damaged": True}
    same_store = state.get("tracking_uri") == redact_uri(tracking_uri)  # stored redacted
    return state if same_store else {}


def _run_of_folder(tracker: MlflowTracker, experiment: str,
                   output_dir: Path) -> tuple[str | None, str | None]:
    """(id, key) of the newest run of `experiment` that trained into `output_dir` (every run is
    tagged with its folder), when the folder's record of it is damaged; (None, None) if none."""
    if "'" in str(output_dir):  # would end the filter's string early
        return None, None
    runs = tracker.client.search_runs(
        [tracker.experiment_id(experiment)],
        filter_string=f"tags.`vacsr.output_dir` = '{output_dir}'",
        order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        return None, None
    return runs[0].info.run_id, runs[0].data.tags.get(RUN_KEY_TAG)


def _write_run_state(output_dir: Path, state: dict) -> None:
    """Whole or not at all: a half-written file would make the restart lose its run."""
    atomic_write_json(output_dir / RUN_STATE_FILE, state)
