"""run_sweep: every dataset's search, the best config re-run on seeds, the table, MLflow records.

MLflow layout: experiment `vacsr-<kind>`; a parent run per sweep; a child per dataset (best config
YAML, best_* metrics); under it a child per trial and per final seed run.
"""
from __future__ import annotations

import copy
from statistics import mean

import ray

from vacsr.distributed.cluster import ensure_ray
from vacsr.distributed.train import fit_ray
from vacsr.sweep.driver import SweepSpec, SweepState, search_dataset, write_best_config
from vacsr.sweep.report import base_novel_rows, to_markdown, write_table
from vacsr.tracking import MlflowTracker

DOMAIN_SHIFTS = ("imagenetv2", "imagenet_sketch", "imagenet_a", "imagenet_r")
from vacsr.train.evaluate import evaluate_checkpoint


def _final_config(best, spec: SweepSpec, dataset: str, seed: int, parent_run_id: str):
    config = copy.deepcopy(best)
    config.train.seed = seed
    config.train.output_dir = str(spec.storage / "final" / dataset / f"seed{seed}")
    config.train.storage_path = str(spec.storage / "final" / "ray")
    config.tracking.enabled = True
    config.tracking.uri = spec.tracking_uri
    config.tracking.experiment = spec.experiment
    config.tracking.parent_run_id = parent_run_id
    config.tracking.run_name = f"{dataset}-final-seed{seed}"
    return config


def final_runs(spec: SweepSpec, dataset: str, best, dataset_run_id: str) -> dict:
    """Re-run the selected config on every seed; test metrics (and novel classes) per seed."""
    evaluate = ray.remote(num_cpus=1)(evaluate_checkpoint)
    per_seed = []
    for seed in spec.seeds:
        config = _final_config(best, spec, dataset, seed, dataset_run_id)
        result = fit_ray(config, name=f"{dataset}-seed{seed}")
        metrics = {k[len("test/"):]: v for k, v in result.final_metrics.items()
                   if k.startswith("test/")}
        if spec.kind == "base2novel":
            novel = ray.get(evaluate.remote(config, str(result.checkpoint), subsample="novel"))
            metrics["novel_acc"] = novel["acc"]
        elif spec.kind == "domain_generalization":  # the ImageNet-trained model on each shift
            shifted = {name: evaluate.remote(config, str(result.checkpoint), dataset=name,
                                             subsample="all") for name in DOMAIN_SHIFTS}
            metrics.update({f"{name}_acc": ray.get(ref)["acc"] for name, ref in shifted.items()})
            metrics["ood_avg_acc"] = mean(metrics[f"{name}_acc"] for name in DOMAIN_SHIFTS)
        per_seed.append(metrics)
        print(f"  {dataset} seed {seed}: " + ", ".join(f"{k}={v:.2f}" for k, v in metrics.items()),
              flush=True)
    return {"per_seed": per_seed}


def _summary(spec: SweepSpec, dataset: str, best: dict, finals: dict) -> dict:
    per_seed = finals["per_seed"]
    if spec.kind == "base2novel":
        return {"base": [m["acc"] for m in per_seed], "novel": [m["novel_acc"] for m in per_seed],
                "val": best["val"]}
    keys = sorted(set.intersection(*(set(m) for m in per_seed)))
    return {"metrics": {k: mean(m[k] for m in per_seed) for k in keys}, "val": best["val"]}


def run_dataset(spec: SweepSpec, dataset: str, parent_run_id: str, state: SweepState) -> dict:
    entry = state.dataset(dataset)
    child = MlflowTracker(spec.tracking_uri)
    entry["run_id"] = child.start(spec.experiment, dataset, parent_run_id=parent_run_id,
                                  run_id=entry.get("run_id"),
                                  tags={"vacsr.dataset": dataset, "vacsr.sweep": spec.name})
    state.save()
    print(f"[{spec.name}] {dataset}: searching {spec.trials} trials on {spec.metric}", flush=True)
    best = search_dataset(spec, dataset, entry["run_id"])
    folder = spec.storage / "best" / dataset
    child.log_artifact(write_best_config(best["config"], folder))
    finals = final_runs(spec, dataset, best["config"], entry["run_id"])
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
    ensure_ray()
    state = SweepState(spec.storage / "sweep_state.json", fresh=not spec.resume)
    parent = MlflowTracker(spec.tracking_uri)
    state.data["parent_run_id"] = parent.start(
        spec.experiment, spec.name, run_id=state.data.get("parent_run_id"),
        tags={"vacsr.sweep": spec.name, "vacsr.kind": spec.kind})
    state.save()
    results = {}
    for dataset in spec.datasets:
        entry = state.dataset(dataset)
        results[dataset] = (entry["result"] if entry.get("done") else
                            run_dataset(spec, dataset, state.data["parent_run_id"], state))
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
