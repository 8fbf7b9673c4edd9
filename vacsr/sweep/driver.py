"""The sweep driver: per dataset a Tune + Optuna search of Ray Train trials, then the best config
re-run on seeds, evaluated, tabulated and recorded in MLflow (paper sec. 4.1, appendix C).

State that a restarted driver needs (`--resume`) lives in <sweep folder>/sweep_state.json: the
MLflow run ids and each finished dataset's results; Tune's own experiment folders and the Optuna
RDB storage hold the trials.
"""
from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.registry import TRAINABLE_CLASS, _global_registry
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.optuna import OptunaSearch

from vacsr.config import flatten, load_config, save_config
from vacsr.distributed.cluster import ensure_ray
from vacsr.distributed.train import CHECKPOINT_FILE
from vacsr.errors import ConfigError
from vacsr.sweep.space import DefineByRun, clamp_blocks, space_for, start_point
from vacsr.sweep.trial import run_trial, trial_config_to_config
from vacsr.tracking import (MlflowTracker, redact_uri, check_tracking_uri,
                            resolve_tracking_uri)


@dataclass
class SweepSpec:
    kind: str  # "base2novel" | "retrieval" | "domain_generalization"
    name: str
    datasets: list[str]
    overrides: dict[str, list[str]]  # dataset -> config overrides shared by all its runs
    metric: str  # the selection metric, always a val/* metric
    storage: Path  # absolute sweep folder
    tracking_uri: str
    trials: int = 8
    seeds: tuple[int, ...] = (1, 2, 3)
    space_overrides: dict = field(default_factory=dict)
    sampler_seed: int = 0
    resume: bool = False
    mode: str = "max"
    parallel: int = 0  # datasets searched at once; 0 = as many as the cluster holds trials
    ray_storage: str = ""  # Tune/Train experiments + checkpoints: path or s3:// gs:// URI
    optuna_url: str = ""  # Optuna RDB storage; default sqlite in the sweep folder
    ray_address: str | None = None  # None: RAY_ADDRESS, else a local Ray instance
    trial_cpus: float = 1.0  # the Tune trial actor (it only drives its TorchTrainer)

    @property
    def experiment(self) -> str:
        return f"vacsr-{self.kind}"

    @property
    def ray_root(self) -> str:
        """Where Tune/Train keep experiments and checkpoints: --ray-storage, else the sweep
        folder."""
        return self.ray_storage or str(self.storage)

    def ray_path(self, *parts: str) -> str:
        return join_storage(self.ray_root, *parts)


def join_storage(root: str, *parts: str) -> str:
    """`root`/parts for a local path or a URI (s3://, gs://, file://): pyarrow takes both."""
    if "://" in root:
        return "/".join([root.rstrip("/"), *parts])
    return str(Path(root, *parts))


def storage_filesystem(root: str):
    """The pyarrow filesystem `root` (a local path or an s3:// gs:// file:// URI) lives on."""
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(root)[0] if "://" in root else pafs.LocalFileSystem()


def copy_from_storage(root: str, path: str, dest: Path) -> Path:
    """Copy `path` (a file on the storage `root` lives on, as Ray Train reports it) to `dest`."""
    import pyarrow.fs as pafs

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    pafs.copy_files(path, str(tmp), source_filesystem=storage_filesystem(root),
                    destination_filesystem=pafs.LocalFileSystem())
    tmp.replace(dest)
    return dest


def select_best(trials: list[dict], metric: str, mode: str = "max") -> dict:
    """The trial whose last reported `metric` (a val metric) is best; test metrics never count.
    Ties go to the earlier trial; trials without the metric are skipped."""
    if not metric.startswith("val/"):
        raise ValueError(f"selection must use a val metric, got {metric!r}")
    scored = [t for t in trials if isinstance(t.get("metrics", {}).get(metric), (int, float))
              and math.isfinite(t["metrics"][metric])]
    if not scored:
        raise RuntimeError(f"no trial reported {metric}")
    sign = 1 if mode == "max" else -1
    return max(scored, key=lambda t: (sign * t["metrics"][metric], -trials.index(t)))


def concurrency(workers: int, cpus_per_worker: float, gpus_per_worker: float,
                driver_cpus: float = 1.0) -> int:
    """Trials the cluster can hold at once: each needs its driver plus its workers."""
    resources = ray.cluster_resources()
    by_cpu = resources.get("CPU", 1) // (driver_cpus + workers * cpus_per_worker)
    limit = by_cpu
    if gpus_per_worker > 0:
        limit = min(limit, resources.get("GPU", 0) // (workers * gpus_per_worker))
    return max(1, int(limit))


def plan_parallelism(spec: SweepSpec) -> tuple[int, int]:
    """(datasets searched at once, concurrent trials per dataset). Their product never exceeds the
    trials the cluster holds, so no trial actor waits forever for its Train workers."""
    base = load_config(overrides=spec.overrides[spec.datasets[0]])
    slots = concurrency(base.train.workers, base.train.cpus_per_worker,
                        base.train.gpus_per_worker, spec.trial_cpus)
    parallel = max(1, min(spec.parallel or slots, slots, len(spec.datasets)))
    return parallel, max(1, slots // parallel)


class SweepState:
    """sweep_state.json: MLflow run ids and finished datasets, rewritten atomically (and under a
    lock: datasets searched in parallel threads update it)."""

    def __init__(self, path: Path, fresh: bool) -> None:
        self.path = path
        self.data = {} if fresh or not path.is_file() else json.loads(path.read_text())
        self.data.setdefault("datasets", {})
        self._lock = threading.Lock()

    def save(self) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(self.data, indent=2))
            tmp.replace(self.path)

    def dataset(self, name: str) -> dict:
        return self.data["datasets"].setdefault(name, {})


def _tuner(spec: SweepSpec, dataset: str, parent_run_id: str, trainable,
           max_concurrent: int) -> tune.Tuner:
    """A new Tuner, or the restored one when --resume finds this dataset's experiment."""
    folder = spec.ray_path("tune", dataset)
    if spec.resume and tune.Tuner.can_restore(folder):
        return tune.Tuner.restore(folder, trainable=trainable, resume_unfinished=True,
                                  restart_errored=True)
    base = load_config(overrides=spec.overrides[dataset])
    space = space_for(spec.kind, dataset, spec.space_overrides, workers=base.train.workers)
    if base.model.name == "vacsr-tiny":
        space = clamp_blocks(space, 3, 3)
    search = OptunaSearch(DefineByRun(space), metric=spec.metric, mode=spec.mode,
                          storage=optuna_storage(spec), study_name=f"{spec.name}-{dataset}",
                          seed=spec.sampler_seed, points_to_evaluate=[start_point(space, base)])
    max_epochs = max(base.train.epochs, getattr(space.get("train.epochs"), "high", 0))
    meta = {"trial_root": str(spec.storage / "trials" / dataset), "dataset": dataset,
            "ray_storage": spec.ray_path("trials", dataset),
            "tracking_uri": spec.tracking_uri, "experiment": spec.experiment,
            "parent_run_id": parent_run_id}
    return tune.Tuner(
        trainable,
        param_space={"base": flatten(base), "meta": meta},
        tune_config=tune.TuneConfig(
            metric=spec.metric, mode=spec.mode, search_alg=search, num_samples=spec.trials,
            # max_t beyond the longest trial: ASHA stops a trial that reaches max_t at once,
            # which would cut off its last MLflow logging (metrics.json, curves); trials that run
            # all their epochs must end by themselves
            scheduler=ASHAScheduler(time_attr="epoch", max_t=max(max_epochs, 1) + 1,
                                    grace_period=1),
            max_concurrent_trials=max_concurrent),
        run_config=tune.RunConfig(name=dataset, storage_path=spec.ray_path("tune"),
                                  verbose=0, callbacks=[TrialProgress(spec, dataset)]))


class TrialProgress(tune.Callback):
    """One line per finished trial (Tune's own tables are off: datasets run side by side)."""

    def __init__(self, spec: SweepSpec, dataset: str) -> None:
        self.spec, self.dataset, self.count = spec, dataset, 0

    def _line(self, trial, status: str) -> None:
        self.count += 1
        value = (trial.last_result or {}).get(self.spec.metric)
        shown = f"{value:.2f}" if isinstance(value, (int, float)) else "-"
        epochs = (trial.last_result or {}).get("epoch", 0)
        print(f"[{self.spec.name}] {self.dataset}: trial {self.count}/{self.spec.trials} "
              f"{trial.trial_id} {status} after {epochs} epoch(s), {self.spec.metric}={shown}",
              flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._line(trial, "done")

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._line(trial, "FAILED")


_OPTUNA_LOCK = threading.Lock()
_OPTUNA_STORAGES: dict[str, Any] = {}


def optuna_storage(spec: SweepSpec):
    """One RDBStorage per database, shared by the dataset threads (creating the schema from
    several threads at once races)."""
    import optuna

    url = spec.optuna_url or f"sqlite:///{spec.storage / 'optuna.db'}"
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    with _OPTUNA_LOCK:
        if url not in _OPTUNA_STORAGES:
            try:
                _OPTUNA_STORAGES[url] = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
            except Exception as exc:  # SQLAlchemy/driver errors: name the storage, stop early
                raise ConfigError(f"--optuna-storage {redact_uri(url)}: cannot open "
                                  f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
        return _OPTUNA_STORAGES[url]


_REGISTRY_LOCK = threading.Lock()


def registered_trial(trial_cpus: float) -> str:
    """The trial function registered once under a name: Tuners given a callable register it on
    every fit, and Tune's registry is not safe for datasets searched in parallel threads."""
    name = f"vacsr_trial_cpu{trial_cpus:g}"
    with _REGISTRY_LOCK:
        if not _global_registry.contains(TRAINABLE_CLASS, name):
            tune.register_trainable(name, tune.with_resources(run_trial, {"CPU": trial_cpus}))
    return name


def search_dataset(spec: SweepSpec, dataset: str, dataset_run_id: str,
                   max_concurrent: int = 1) -> dict:
    """Run (or resume) the dataset's search; return the best trial's config and val metric."""
    trainable = registered_trial(spec.trial_cpus)
    results = _tuner(spec, dataset, dataset_run_id, trainable, max_concurrent).fit()
    trials = [{"config": r.config, "metrics": dict(r.metrics or {})} for r in results if r.config]
    close_running_children(spec.tracking_uri, spec.experiment, dataset_run_id)
    best = select_best(trials, spec.metric, spec.mode)
    config = trial_config_to_config(best["config"])
    metrics = best["metrics"]
    finished = metrics.get("epoch") == config.train.epochs and metrics.get("checkpoint_path")
    return {"config": config, "val": metrics[spec.metric], "num_trials": len(trials),
            "trial_id": metrics.get("trial_id"),
            # the trial ran every epoch (ASHA did not stop it): its last checkpoint is final
            "checkpoint": f"{metrics['checkpoint_path']}/{CHECKPOINT_FILE}" if finished else None}


def close_running_children(uri: str, experiment: str, parent_run_id: str) -> int:
    """Trials stopped early by ASHA (or lost with a killed driver) leave MLflow runs RUNNING;
    mark them KILLED. Returns how many were closed."""
    tracker = MlflowTracker(uri)
    runs = tracker.client.search_runs(
        [tracker.experiment_id(experiment)],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}' "
                      "and attributes.status = 'RUNNING'")
    for run in runs:
        tracker.client.set_terminated(run.info.run_id, status="KILLED")
    return len(runs)


def write_best_config(config, folder: Path) -> Path:
    """The best config as YAML that `vacsr train --config` accepts unchanged."""
    config.train.ray = False
    path = folder / "best_config.yaml"
    save_config(config, path)
    return path


def sweep_folder(root: str | os.PathLike, name: str) -> Path:
    return Path(root).expanduser().resolve() / name


def prepare_tracking(uri: str | None, storage: Path) -> str:
    """Resolve and check the MLflow URI before any trial starts (clear error if unreachable)."""
    resolved = resolve_tracking_uri(uri, default_dir=storage)
    check_tracking_uri(resolved)
    return resolved


__all__ = ["SweepSpec", "SweepState", "close_running_children", "concurrency", "copy_from_storage",
           "ensure_ray", "join_storage", "plan_parallelism", "prepare_tracking", "search_dataset",
           "select_best", "storage_filesystem", "sweep_folder", "write_best_config"]
