"""run_sweep: every dataset's search, the best config re-run on seeds, the table, MLflow records.

MLflow layout: experiment `vacsr-<kind>`; a parent run per sweep; a child per dataset (best config
YAML, best_* metrics); under it a child per trial and per final seed run.
"""
from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean

import ray

from vacsr.distributed.cluster import ensure_ray
from vacsr.distributed.train import CHECKPOINT_FILE, fit_ray
from vacsr.sweep.driver import (SweepSpec, SweepState, copy_from_storage, plan_parallelism,
                                search_dataset, write_best_config)
from vacsr.sweep.report import base_novel_rows, to_markdown, write_table
from vacsr.tracking import MlflowTracker, TrackingCallback
from vacsr.train.evaluate import evaluate_checkpoint

DOMAIN_SHIFTS = ("imagenetv2", "imagenet_sketch", "imagenet_a", "imagenet_r")


def _final_config(best, spec: SweepSpec, dataset: str, seed: int, parent_run_id: str):
    config = copy.deepcopy(best)
    config.train.seed = seed
    config.train.output_dir = str(spec.storage / "final" / dataset / f"seed{seed}")
    config.train.storage_path = spec.ray_path("final")
    config.tracking.enabled = True
    config.tracking.uri = spec.tracking_uri
    config.tracking.experiment = spec.experiment
    config.tracking.parent_run_id = parent_run_id
    config.tracking.run_name = f"{dataset}-final-seed{seed}"
    return config


def _test_metrics(metrics: dict) -> dict:
    return {k[len("test/"):]: v for k, v in metrics.items() if k.startswith("test/")}


def _reuse_trial(spec: SweepSpec, config, best: dict, evaluate) -> tuple[dict, Path]:
    """The best trial trained this very config on this seed to the end: evaluate its checkpoint
    on test instead of training it again (runs are seeded, so a re-run would repeat it)."""
    checkpoint = copy_from_storage(spec.ray_root, best["checkpoint"],
                                   Path(config.train.output_dir) / CHECKPOINT_FILE)
    metrics = ray.get(evaluate.remote(config, str(checkpoint)))
    # resume=True: a driver restarted after this point continues the same MLflow run
    tracker = TrackingCallback.start(
        config, experiment=spec.experiment, run_name=config.tracking.run_name,
        tracking_uri=spec.tracking_uri, parent_run_id=config.tracking.parent_run_id, resume=True,
        tags={"vacsr.reused_trial": best["trial_id"], "vacsr.seed": config.train.seed}).tracker()
    tracker.log_epoch(config.train.epochs, {f"test/{k}": v for k, v in metrics.items()})
    tracker.finish()
    return metrics, checkpoint


def final_runs(spec: SweepSpec, dataset: str, best: dict, dataset_run_id: str) -> dict:
    """Re-run the selected config on every seed; test metrics (and novel classes) per seed."""
    cfg = best["config"]
    evaluate = ray.remote(num_cpus=cfg.train.cpus_per_worker,
                          num_gpus=min(cfg.train.gpus_per_worker, 1))(evaluate_checkpoint)
    # the seed whose run the best trial already is, when it trained all its epochs
    reused_seed = cfg.train.seed if best.get("checkpoint") else None
    per_seed = []
    for seed in spec.seeds:
        config = _final_config(cfg, spec, dataset, seed, dataset_run_id)
        if seed == reused_seed:
            metrics, checkpoint = _reuse_trial(spec, config, best, evaluate)
        else:
            result = fit_ray(config, name=f"{dataset}-seed{seed}")
            metrics, checkpoint = _test_metrics(result.final_metrics), result.checkpoint
        if spec.kind == "base2novel":
            novel = ray.get(evaluate.remote(config, str(checkpoint), subsample="novel"))
            metrics["novel_acc"] = novel["acc"]
        elif spec.kind == "domain_generalization":  # the ImageNet-trained model on each shift
            shifted = {name: evaluate.remote(config, str(checkpoint), dataset=name,
                                             subsample="all") for name in DOMAIN_SHIFTS}
            metrics.update({f"{name}_acc": ray.get(ref)["acc"] for name, ref in shifted.items()})
            metrics["ood_avg_acc"] = mean(metrics[f"{name}_acc"] for name in DOMAIN_SHIFTS)
        per_seed.append(metrics)
        print(f"  {dataset} seed {seed}: " + ", ".join(f"{k}={v:.2f}" for k, v in metrics.items()),
              flush=True)
    return {"per_seed": per_seed,
            "reused_trial": best.get("trial_id") if reused_seed in spec.seeds else None}


def _summary(spec: SweepSpec, dataset: str, best: dict, finals: dict) -> dict:
    per_seed = finals["per_seed"]
    if spec.kind == "base2novel":
        return {"base": [m["acc"] for m in per_seed], "novel": [m["novel_acc"] for m in per_seed],
                "val": best["val"]}
    keys = sorted(set.intersection(*(set(m) for m in per_seed)))
    return {"metrics": {k: mean(m[k] for m in per_seed) for k in keys}, "val": best["val"]}


def run_dataset(spec: SweepSpec, dataset: str, parent_run_id: str, state: SweepState,
                max_concurrent: int = 1) -> dict:
    entry = state.dataset(dataset)
    child = MlflowTracker(spec.tracking_uri)
    entry["run_id"] = child.start(spec.experiment, dataset, parent_run_id=parent_run_id,
                                  run_id=entry.get("run_id"),
                                  tags={"vacsr.dataset": dataset, "vacsr.sweep": spec.name})
    state.save()
    print(f"[{spec.name}] {dataset}: searching {spec.trials} trials on {spec.metric}", flush=True)
    best = search_dataset(spec, dataset, entry["run_id"], max_concurrent)
    folder = spec.storage / "best" / dataset
    child.log_artifact(write_best_config(best["config"], folder))
    finals = final_runs(spec, dataset, best, entry["run_id"])
    summary = _summary(spec, dataset, best, finals)
    child.log_best({spec.metric: best["val"], "num_trials": best["num_trials"],
                    **{f"test_{k}": mean(m[k] for m in finals["per_seed"])
                       for k in finals["per_seed"][0]}})
    child.log_json("final_runs.json", finals)
    child.finish()
    entry.update(done=True, result=summary)
    state.save()
    return summary


def _rows(spec: SweepSpec, results: dict) -> list[dict]:
    if spec.kind == "base2novel":
        return base_novel_rows(results)
    return [{"dataset": d, "val": r["val"], **r["metrics"]} for d, r in results.items()]


def _markdown(spec: SweepSpec, rows: list[dict]) -> str:
    if spec.kind == "base2novel":
        return to_markdown(rows)
    keys = [k for k in rows[0] if k != "dataset"] if rows else []
    lines = ["| dataset | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    lines += ["| " + r["dataset"] + " | " + " | ".join(f"{r[k]:.2f}" for k in keys) + " |"
              for r in rows]
    return "\n".join(lines) + "\n"


def run_sweep(spec: SweepSpec) -> list[dict]:
    """The whole sweep; returns the table rows (also printed and logged to the parent run)."""
    spec.storage.mkdir(parents=True, exist_ok=True)
    ensure_ray(address=spec.ray_address)
    state = SweepState(spec.storage / "sweep_state.json", fresh=not spec.resume)
    parent = MlflowTracker(spec.tracking_uri)
    state.data["parent_run_id"] = parent.start(
        spec.experiment, spec.name, run_id=state.data.get("parent_run_id"),
        tags={"vacsr.sweep": spec.name, "vacsr.kind": spec.kind})
    state.save()
    results = {d: state.dataset(d)["result"] for d in spec.datasets
               if state.dataset(d).get("done")}
    pending = [d for d in spec.datasets if d not in results]
    parallel, per_dataset = plan_parallelism(spec)
    print(f"[{spec.name}] {len(pending)} dataset(s) to search, {parallel} at a time, "
          f"{per_dataset} concurrent trial(s) each", flush=True)
    # threads, not processes: each dataset's Tuner only waits on Ray; finished datasets are
    # recorded as they end, so a killed driver resumes after the last one that finished
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="dataset") as pool:
        futures = {d: pool.submit(run_dataset, spec, d, state.data["parent_run_id"], state,
                                  per_dataset) for d in pending}
        try:
            for dataset, future in futures.items():
                results[dataset] = future.result()
        except BaseException:
            for future in futures.values():
                future.cancel()  # datasets not started yet; running ones finish their step
            raise
    results = {d: results[d] for d in spec.datasets}  # table rows in the sweep's order
    rows = _rows(spec, results)
    folder = spec.storage / "report"
    if spec.kind == "base2novel":
        for path in write_table(rows, folder):
            parent.log_artifact(path)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.md").write_text(_markdown(spec, rows))
        parent.log_artifact(folder / "results.md")
    parent.log_best({k: v for k, v in rows[-1].items() if isinstance(v, float)})
    parent.finish()
    print("\n" + _markdown(spec, rows))
    return rows


def mlflow_ui_hint(uri: str) -> str:
    return f"mlflow ui --backend-store-uri {uri}   # then open http://127.0.0.1:5000"


__all__ = ["run_sweep", "mlflow_ui_hint"]
