"""The sweep driver: per dataset a Tune + Optuna search of Ray Train trials, then the best config
re-run on seeds, evaluated, tabulated and recorded in MLflow (DESIGN.md sections 4 and 6).

State that a restarted driver needs (`--resume`) lives in <sweep folder>/sweep_state.json: the
MLflow run ids and each finished dataset's results; Tune's own experiment folders and the Optuna
RDB storage hold the trials.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.optuna import OptunaSearch

from vacsr.config import flatten, from_dict, load_config, save_config
from vacsr.distributed.cluster import ensure_ray
from vacsr.sweep.space import DefineByRun, clamp_blocks, space_for
from vacsr.sweep.trial import flatten_nested, run_trial
from vacsr.tracking import MlflowTracker, check_tracking_uri, resolve_tracking_uri


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
    final_eval: Any = None  # callable(config, checkpoint) -> extra metrics (e.g. novel classes)

    @property
    def experiment(self) -> str:
        return f"vacsr-{self.kind}"


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


class SweepState:
    """sweep_state.json: MLflow run ids and finished datasets, rewritten atomically."""

    def __init__(self, path: Path, fresh: bool) -> None:
        self.path = path
        self.data = {} if fresh or not path.is_file() else json.loads(path.read_text())
        self.data.setdefault("datasets", {})

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        tmp.replace(self.path)

    def dataset(self, name: str) -> dict:
        return self.data["datasets"].setdefault(name, {})


def _tuner(spec: SweepSpec, dataset: str, parent_run_id: str, trainable) -> tune.Tuner:
    """A new Tuner, or the restored one when --resume finds this dataset's experiment."""
    folder = spec.storage / "tune" / dataset
    if spec.resume and tune.Tuner.can_restore(str(folder)):
        return tune.Tuner.restore(str(folder), trainable=trainable, resume_unfinished=True,
                                  restart_errored=True)
    base = load_config(overrides=spec.overrides[dataset])
    space = clamp_blocks(space_for(spec.kind, dataset, spec.space_overrides), 3, 3) \
        if base.model.name == "vacsr-tiny" else space_for(spec.kind, dataset, spec.space_overrides)
    search = OptunaSearch(DefineByRun(space), metric=spec.metric, mode=spec.mode,
                          storage=_optuna_storage(spec), study_name=f"{spec.name}-{dataset}",
                          seed=spec.sampler_seed)
    max_epochs = max(base.train.epochs, getattr(space.get("train.epochs"), "high", 0))
    meta = {"trial_root": str(spec.storage / "trials" / dataset), "dataset": dataset,
            "tracking_uri": spec.tracking_uri, "experiment": spec.experiment,
            "parent_run_id": parent_run_id}
    return tune.Tuner(
        trainable,
        param_space={"base": flatten(base), "meta": meta},
        tune_config=tune.TuneConfig(
            metric=spec.metric, mode=spec.mode, search_alg=search, num_samples=spec.trials,
            scheduler=ASHAScheduler(time_attr="epoch", max_t=max(max_epochs, 1), grace_period=1),
            max_concurrent_trials=concurrency(base.train.workers, base.train.cpus_per_worker,
                                              base.train.gpus_per_worker)),
        run_config=tune.RunConfig(name=dataset, storage_path=str(spec.storage / "tune")))


def _optuna_storage(spec: SweepSpec):
    import optuna

    url = f"sqlite:///{spec.storage / 'optuna.db'}"
    return optuna.storages.RDBStorage(url)


def search_dataset(spec: SweepSpec, dataset: str, dataset_run_id: str) -> dict:
    """Run (or resume) the dataset's search; return the best trial's config and val metric."""
    trainable = tune.with_resources(run_trial, {"CPU": 1})
    results = _tuner(spec, dataset, dataset_run_id, trainable).fit()
    trials = [{"config": r.config, "metrics": dict(r.metrics or {}), "path": r.path}
              for r in results]
    close_running_children(spec.tracking_uri, spec.experiment, dataset_run_id)
    best = select_best(trials, spec.metric, spec.mode)
    config = from_dict(dict(best["config"]["base"]))
    from vacsr.config import set_value

    for key, value in flatten_nested({k: v for k, v in best["config"].items()
                                      if k not in ("base", "meta")}).items():
        set_value(config, key, value)
    return {"config": config, "val": best["metrics"][spec.metric], "num_trials": len(trials)}


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


__all__ = ["SweepSpec", "SweepState", "concurrency", "close_running_children", "ensure_ray",
           "prepare_tracking", "search_dataset", "select_best", "sweep_folder",
           "write_best_config"]
