"""MLflow tracking: the only library module that imports mlflow (the library core never does).

- `resolve_tracking_uri` / `check_tracking_uri`: pick the store (SQLite next to the runs by default,
  always as an absolute path because Ray trials change their working directory) and fail fast with a
  one-line ConfigError before any training starts.
- `MlflowTracker`: one MLflow run driven through `MlflowClient` and its run id, never the fluent
  global "active run", so a sweep can hold a parent, per-dataset children and trials in one process.
  Metric logging is idempotent per (metric, epoch): a resumed run never repeats or loses an epoch.
- `TrackingCallback`: the picklable per-epoch callback for `Trainer.fit(callbacks=...)`.

Layout in MLflow: one experiment per sweep kind; a parent run per sweep, a child run per dataset and
a child per trial (tag `mlflow.parentRunId`); params = the flattened config; metrics per epoch with
step = epoch number (1-based, the "epoch" entry of the history); `best_*` metrics at the end.
"""
from __future__ import annotations

import json
import logging
import math
import numbers
import os
import re
import socket
import sqlite3
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from vacsr.config import Config, flatten, save_config
from vacsr.errors import ConfigError
from vacsr.plots import plot_training_curves

log = logging.getLogger(__name__)

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"  # next to the SQLite file, like `mlflow server`'s default
PARENT_TAG = "mlflow.parentRunId"
RUN_STATE_FILE = "mlflow_run.json"  # in a training output_dir: the run a resumed training continues
# MLflow's limits (mlflow.utils.validation); exceeding them makes log_batch fail.
MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


# ---------------------------------------------------------------- tracking URI
def _absolute(path: str | Path) -> Path:
    """Absolute, user-expanded, without following symlinks (the folder may not exist yet)."""
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def _scheme(uri: str) -> str | None:
    """Lower-case URI scheme, or None for a bare path (a one-letter "scheme" is a drive letter)."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.\-]*):", uri)
    return match.group(1).lower() if match and len(match.group(1)) > 1 else None


_SQLITE = re.compile(r"^(sqlite(?:\+\w+)?:///)([^?]*)(\?.*)?$", re.IGNORECASE)


def sqlite_path(uri: str) -> Path | None:
    """The database file of an `sqlite:///...` URI; None for in-memory and non-SQLite URIs."""
    match = _SQLITE.match(uri)
    if not match or match.group(2) in ("", ":memory:"):
        return None
    return Path(urllib.parse.unquote(match.group(2)))


def _absolute_sqlite(uri: str) -> str:
    match, path = _SQLITE.match(uri), sqlite_path(uri)
    if match is None or path is None or (path.is_absolute() and not str(path).startswith("~")):
        return uri
    # "sqlite:///" + "/abs/path" is SQLAlchemy's spelling of an absolute path.
    return f"{match.group(1)}{_absolute(path)}{match.group(3) or ''}"


def _absolute_file(uri: str) -> str:
    parts = urllib.parse.urlsplit(uri)
    if parts.netloc not in ("", "localhost") or parts.path.startswith("/"):
        return uri
    return _absolute(urllib.parse.unquote(parts.path)).as_uri()


def resolve_tracking_uri(uri: str | None = None, default_dir: str | Path = ".") -> str:
    """The tracking URI to use, with every local path made absolute.

    Order: `uri`, else env MLFLOW_TRACKING_URI, else `sqlite:///<abs default_dir>/mlflow.db`.
    A bare path names the folder that holds `mlflow.db` (or the database itself if it ends in .db).
    """
    chosen = (uri or os.environ.get(TRACKING_URI_ENV) or "").strip()
    if not chosen:
        return f"sqlite:///{_absolute(default_dir) / DB_NAME}"
    scheme = _scheme(chosen)
    if scheme is None:
        path = _absolute(chosen)
        return f"sqlite:///{path if path.suffix == '.db' else path / DB_NAME}"
    if scheme.startswith("sqlite"):
        return _absolute_sqlite(chosen)
    if scheme == "file":
        return _absolute_file(chosen)
    return chosen


def redact_uri(uri: str) -> str:
    """The URI without a password, fit for an error message."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _unreachable(uri: str, reason: Any) -> ConfigError:
    reason = " ".join(str(reason).split())  # one line, whatever the OS error text holds
    return ConfigError(f"MLflow tracking URI {redact_uri(uri)}: {reason}")


def check_tracking_uri(uri: str | None, timeout_s: float = 5.0) -> None:
    """Raise ConfigError naming the URI unless its store can be reached and written.

    Call before training or trials start: MLflow itself retries an absent server for minutes and
    fails deep inside a worker. Creates the folder of an SQLite database (SQLite will not).
    """
    resolved = resolve_tracking_uri(uri)
    shown = uri or resolved
    scheme = _scheme(resolved) or ""
    if scheme in ("http", "https"):
        _check_http(shown, resolved, timeout_s)
    elif scheme.startswith("sqlite"):
        _check_sqlite(shown, resolved, timeout_s)
    elif scheme == "file":
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
            raise _unreachable(shown, "the file store is refused by MLflow >= 3.13 (use sqlite:///"
                                      "<folder>/mlflow.db or set MLFLOW_ALLOW_FILE_STORE=true)")
        _check_folder(shown, _absolute(urllib.parse.urlsplit(resolved).path))
    elif scheme.split("+")[0] in DB_PORTS:
        _check_tcp(shown, resolved, timeout_s)
    else:
        raise _unreachable(shown, f"unsupported scheme {scheme!r} (use sqlite, http(s), "
                                  "postgresql, mysql or mssql)")


def _check_http(shown: str, uri: str, timeout_s: float) -> None:
    parts = urllib.parse.urlsplit(uri)  # urllib cannot parse user:password@ hosts: drop them
    health = parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1],
                            path=parts.path.rstrip("/") + "/health", query="", fragment="")
    try:
        with urllib.request.urlopen(urllib.parse.urlunsplit(health), timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:  # answered: 4xx still means a server is there
        status = exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _unreachable(shown, f"server not answering within {timeout_s:g} s "
                                  f"({getattr(exc, 'reason', exc)})") from None
    if status >= 500:
        raise _unreachable(shown, f"server answered HTTP {status}")


def _check_folder(shown: str, folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # a real write: os.access lies for root
            pass
    except OSError as exc:
        raise _unreachable(shown, f"folder {folder} is not writable "
                                  f"({exc.strerror or exc.__class__.__name__})") from None


def _check_sqlite(shown: str, uri: str, timeout_s: float) -> None:
    path = sqlite_path(uri)
    if path is None:  # in-memory database: nothing on disk to check
        return
    _check_folder(shown, _absolute(path).parent)
    if not path.exists():
        return
    try:  # mode=rw: open an existing file for writing, never create one
        conn = sqlite3.connect(f"file:{urllib.parse.quote(str(_absolute(path)))}?mode=rw",
                               uri=True, timeout=timeout_s)
        try:
            conn.execute("PRAGMA schema_version").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise _unreachable(shown, f"{path} is not a writable SQLite database ({exc})") from None


def _check_tcp(shown: str, uri: str, timeout_s: float) -> None:
    parts = urllib.parse.urlsplit(uri)
    if not parts.hostname:  # a local socket given in the query: let the driver report it
        return
    port = parts.port or DB_PORTS[_scheme(uri).split("+")[0]]
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        raise _unreachable(shown, f"database server {parts.hostname}:{port} not answering "
                                  f"({exc.strerror or exc})") from None


# ---------------------------------------------------------------- names and values
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


def _chunks(items: list, size: int) -> list[list]:
    return [items[start:start + size] for start in range(0, len(items), size)]


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------- one MLflow run
class MlflowTracker:
    """One MLflow run, addressed by run id through its own MlflowClient.

    `with MlflowTracker(uri) as tracker: tracker.start(...)` ends the run FINISHED, or FAILED
    (KILLED on Ctrl-C) when the block raises.
    """

    def __init__(self, tracking_uri: str | None = None, *, default_dir: str | Path = ".") -> None:
        self.tracking_uri = resolve_tracking_uri(tracking_uri, default_dir)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.run_id: str | None = None
        self._read_store = False  # the run may hold metrics this tracker did not log itself
        self._steps: dict[str, set[int]] = {}  # metric -> steps known to be in the run

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
              tags: Mapping[str, Any] | None = None, run_id: str | None = None) -> str:
        """Create a run in `experiment` (created if missing), or resume `run_id`; return its id."""
        if self.run_id is not None:
            raise RuntimeError(f"tracker already holds run {self.run_id}; finish() it first")
        all_tags = {k: str(v) for k, v in (tags or {}).items()}
        if parent_run_id:
            all_tags[PARENT_TAG] = parent_run_id
        if run_id is not None:
            return self.resume(run_id, tags=all_tags)
        run = self.client.create_run(self.experiment_id(experiment), run_name=run_name,
                                     tags=all_tags)
        self.run_id, self._read_store, self._steps = run.info.run_id, False, {}
        return self.run_id

    def resume(self, run_id: str, *, tags: Mapping[str, Any] | None = None) -> str:
        """Continue the existing run `run_id` (status back to RUNNING); return its id."""
        if self.run_id is not None:
            raise RuntimeError(f"tracker already holds run {self.run_id}; finish() it first")
        if not self.run_exists(run_id):
            raise ConfigError(f"MLflow run {run_id} not found in {redact_uri(self.tracking_uri)}")
        self.run_id, self._read_store, self._steps = run_id, True, {}
        self.client.update_run(run_id, status="RUNNING")
        if tags:
            self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
        return run_id

    def run_exists(self, run_id: str) -> bool:
        """True when `run_id` is a live (not deleted) run of this store."""
        try:
            return self.client.get_run(run_id).info.lifecycle_stage != "deleted"
        except MlflowException:
            return False

    def experiment_id(self, name: str) -> str:
        """Id of experiment `name`, created (or restored) if needed; safe against a racing trial."""
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return self.client.create_experiment(
                    name, artifact_location=self._artifact_root(name))
            except MlflowException:  # another process created it first
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage == "deleted":
            self.client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id

    def _artifact_root(self, experiment: str) -> str | None:
        """SQLite store: artifacts next to the database, absolute (MLflow's default "./mlruns"
        follows the working directory, which Ray moves). Servers choose their own location."""
        db = sqlite_path(self.tracking_uri)
        if db is None:
            return None
        slug = re.sub(r"[^\w.\-]", "_", experiment).strip(".") or "experiment"
        return (_absolute(db).parent / ARTIFACTS_DIR / slug).as_uri()

    def finish(self, status: str = "FINISHED") -> None:
        """End the run with `status`; a no-op when no run is held."""
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status)
            self.run_id = None

    def _require_run(self) -> str:
        if self.run_id is None:
            raise RuntimeError("no MLflow run: call start() first")
        return self.run_id

    # ------------------------------------------------------------ params
    def log_config(self, config: Config) -> None:
        """Params = flatten(config); on a resumed run only the missing ones (MLflow refuses to
        change a param), changed values are listed in tag `vacsr.params_changed_on_resume`.
        Also logs the resolved config as artifact `config.yaml`."""
        run_id = self._require_run()
        params = {metric_name(k): param_value(v) for k, v in flatten(config).items()}
        existing = self.client.get_run(run_id).data.params if self._read_store else {}
        new = [Param(k, v) for k, v in params.items() if k not in existing]
        for chunk in _chunks(new, MAX_PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=chunk)
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
        if changed:
            log.warning("MLflow run %s resumed with changed config keys %s; the params keep the "
                        "first values", run_id, ", ".join(changed))
            self.client.set_tag(run_id, "vacsr.params_changed_on_resume", ",".join(changed))
        with tempfile.TemporaryDirectory() as tmp:
            save_config(config, Path(tmp) / "config.yaml")
            self.client.log_artifact(run_id, str(Path(tmp) / "config.yaml"))

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
        run_id, now = self._require_run(), _now_ms()
        batch = [Metric(k, v, now, step) for k, v in metrics.items()
                 if step not in self._logged_steps(k)]
        for chunk in _chunks(batch, MAX_METRICS_PER_BATCH):
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


# ---------------------------------------------------------------- the training callback
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
        self.output_dir = str(_absolute(output_dir))
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
        `config.train.resume` — and the output folder names one, continue that run) and log the
        config. Writes output_dir/mlflow_run.json."""
        uri = resolve_tracking_uri(tracking_uri)
        check_tracking_uri(uri)
        output_dir = _absolute(config.train.output_dir)
        tracker = MlflowTracker(uri)
        resume = config.train.resume if resume is None else resume
        stored = _stored_run_id(output_dir, uri) if resume else None
        if stored is not None and not tracker.run_exists(stored):
            stored = None  # the store was reset or the run deleted: start afresh
        run_id = tracker.start(experiment, run_name or output_dir.name, run_id=stored,
                               parent_run_id=parent_run_id,
                               tags={"vacsr.output_dir": str(output_dir), **(tags or {})})
        # record the run first: a process killed while the config is being logged must leave a
        # run that its restart continues, not an orphan beside a second one
        _write_run_state(output_dir, {"run_id": run_id, "tracking_uri": uri,
                                      "experiment": experiment})
        tracker.log_config(config)
        callback = cls(uri, run_id, output_dir, metric=metric, mode=mode)
        callback._tracker = tracker
        return callback

    def tracker(self) -> MlflowTracker:
        """This process's tracker, attached to the run on first use."""
        if self._ended:
            raise RuntimeError(f"MLflow run {self.run_id} already ended by this callback")
        if self._tracker is None:
            self._tracker = MlflowTracker(self.tracking_uri)
            self._tracker.resume(self.run_id)
        return self._tracker

    def __call__(self, epoch: int, metrics: Mapping[str, Any], checkpoint_path: Path) -> None:
        # Step = 1-based epoch number, the same as the history's "epoch" entry.
        self.tracker().log_epoch(int(metrics.get("epoch", epoch + 1)), metrics)

    def finish(self, result, output_dir: str | Path | None = None) -> None:
        """After `fit`: fill any epoch missing from the run, log metrics.json, config.yaml, the
        training curves and the best epoch's metrics as `best_*`, then end the run FINISHED.
        `result` is a TrainResult (its `history` and `final_metrics` are used)."""
        tracker, folder = self.tracker(), Path(output_dir or self.output_dir)
        history = list(result.history)
        tracker.sync_history(history)
        if (folder / "metrics.json").is_file():
            tracker.log_artifact(folder / "metrics.json")
        else:
            tracker.log_json("metrics.json", {"final": result.final_metrics, "history": history})
        if (folder / "config.yaml").is_file():
            tracker.log_artifact(folder / "config.yaml")
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


def _stored_run_id(output_dir: Path, tracking_uri: str) -> str | None:
    """The run id a previous start wrote for this output folder and store, if any."""
    try:
        state = json.loads((output_dir / RUN_STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state.get("run_id") if state.get("tracking_uri") == tracking_uri else None


def _write_run_state(output_dir: Path, state: dict) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = output_dir / f".{RUN_STATE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(output_dir / RUN_STATE_FILE)
