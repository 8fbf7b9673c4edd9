"""One dataset of a sweep, start to end, as the Ray task the driver starts for it
(vacsr/sweep/flow/driver.py): its search, the selected config re-run on the seeds (paper sec. 4.1,
appendix C), and the dataset's MLflow run: the searched keys as params, the best config, the
per-seed test metrics, appendix E's sensitivity analysis and the data it read."""
from __future__ import annotations

from pathlib import Path

from vacsr.config import flatten, save_config
from vacsr.distributed.cluster import quiet_logging
from vacsr.records.artifacts import BEST_CONFIG, FINAL_RUNS
from vacsr.records.sweep_records import SweepRecords
from vacsr.sweep.flow.events import EventSink
from vacsr.sweep.plan.folders import best_folder
from vacsr.sweep.plan.plan import SweepPlan
from vacsr.sweep.report.importance import record_sensitivity
from vacsr.sweep.report.table import readable
from vacsr.sweep.spec.space import active_keys


def write_best_config(config, folder: Path) -> Path:
    """The best config as YAML that `vacsr train --config` accepts unchanged."""
    config.train.ray = False
    path = folder / BEST_CONFIG
    save_config(config, path)
    return path


def run_dataset(plan: SweepPlan, dataset: str, dataset_run_id: str, max_concurrent: int,
                report: EventSink) -> dict:
    """One dataset, start to end (a Ray task): search, final seed runs, its MLflow run."""
    # here, not at the top: the driver process never trains or reads data, and these bring
    # torch, open_clip's model stack and Ray Train (seconds of start-up) that only the dataset's
    # task needs
    from vacsr.records.inputs import log_dataset_inputs
    from vacsr.sweep.final.seeds import final_runs
    from vacsr.sweep.search.tune import search_dataset

    quiet_logging(plan.verbose)
    best = search_dataset(plan, dataset, dataset_run_id, max_concurrent, report)
    run = SweepRecords(plan.tracking_uri, plan.kind.experiment).continue_run(dataset_run_id)
    run.log_artifact(write_best_config(best["config"], best_folder(plan.storage, dataset)))
    values = flatten(best["config"])
    # the keys the chosen config drew (a conditional key it did not draw chose nothing)
    selected = {key: values[key] for key in active_keys(plan.spaces[dataset], values)}
    # as a person reads them (the view's columns); best_config.yaml and the selected trial's run
    # hold the exact values
    run.log_params({key: readable(value) for key, value in selected.items()})
    if len(plan.methods) > 1:  # beside its vacsr.method tag; a one-method sweep's run keeps
        run.log_params({"method": plan.method_of(dataset)})  # its searched keys alone
    importance = record_sensitivity(plan, dataset, run, selected)  # appendix E, per dataset
    log_dataset_inputs(run, best["config"])  # the runs table's Dataset column
    finals = final_runs(plan, dataset, best, dataset_run_id, report)
    per_seed = finals["per_seed"]
    keys = [k for k in per_seed[0] if k != "seed"]
    for row in per_seed:  # per seed at step = seed, so the UI charts them side by side
        run.log_epoch(row["seed"], {f"test_seed/{k}": row[k] for k in keys})
    # their means over seeds are the table's row, logged once the table is made (table/*)
    run.log_best({plan.kind.metric: best["val"], "num_trials": best["num_trials"],
                  "failed_trials": best["failed_trials"]})
    run.log_json(FINAL_RUNS, finals)
    run.finish()
    return {"val": best["val"], "per_seed": per_seed, "num_trials": best["num_trials"],
            "importance": importance}
