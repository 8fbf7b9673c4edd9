"""`vacsr best --compare`: the method comparison of a sweep of several methods, rebuilt from the
MLflow store alone by the functions that wrote its report/comparison.md, from what the runs hold:
the sweep run's COMPARISON_INFO (table spec, budgets, units) and SWEEP_INFO (the selection
metric), and per unit run its per-seed test metrics (FINAL_RUNS), best val and number of trials
(`best_*` metrics), or why it failed (FAILED_TAG). A sweep a stop left unfinished says so first
(vacsr/sweep/report/unfinished.py); its unfinished units are rows of their own, never failures,
and no best method or difference is named from the units that finished."""
from __future__ import annotations

import math
from pathlib import Path

from vacsr.config import DEFAULT_METHOD
from vacsr.errors import ConfigError
from vacsr.records.artifacts import COMPARISON_INFO, FINAL_RUNS, SWEEP_INFO
from vacsr.records.names import METHOD_TAG, metric_name
from vacsr.records.sweep_records import DATASET_TAG, FAILED_TAG, SWEEP_TAG, SweepRecords
from vacsr.sweep.report.best import best_configs, read_records
from vacsr.sweep.report.comparison import build_comparison
from vacsr.sweep.report.comparison_text import comparison_markdown
from vacsr.sweep.report.methods_report import by_method
from vacsr.sweep.report.unfinished import Progress, notice, sweep_progress, unit_note


def _inputs(records: SweepRecords, parent
            ) -> tuple[dict, dict[str, dict], dict[str, str], Progress]:
    """(COMPARISON_INFO, results by unit, failures by unit, the sweep's progress)."""
    name, run_id = parent.data.tags.get(SWEEP_TAG, ""), parent.info.run_id
    methods = parent.data.tags.get(METHOD_TAG, "")
    info = records.artifact_json(run_id, COMPARISON_INFO)
    if info is None and "," not in methods:
        raise ConfigError(f"sweep {name!r} ran one method ({methods or DEFAULT_METHOD}): there is "
                          "nothing to compare (a sweep run with --methods a,b has a comparison)")
    sweep = records.artifact_json(run_id, SWEEP_INFO)
    if info is None or sweep is None:
        raise ConfigError(f"sweep {name!r} (run {run_id}): no "
                          f"{COMPARISON_INFO if info is None else SWEEP_INFO} artifact (a sweep "
                          "recorded before comparisons were stored)")
    best_val = metric_name(f"best_{sweep['metric']}")
    runs = records.dataset_runs(parent)
    progress = sweep_progress(parent, runs, list(info["units"]))
    results, failed = {}, {}
    for run in runs:
        unit = run.data.tags[DATASET_TAG]
        if unit in progress.unfinished:  # no result yet, and no failure either
            continue
        finals = (records.artifact_json(run.info.run_id, FINAL_RUNS)
                  if run.info.status == "FINISHED" else None)
        if finals is None:
            failed[unit] = run.data.tags.get(FAILED_TAG) or f"run {run.info.status}"
            continue
        trials = run.data.metrics.get("best_num_trials")
        results[unit] = {"per_seed": finals["per_seed"],
                         "val": run.data.metrics.get(best_val, math.nan),
                         "num_trials": None if trials is None else int(trials)}
    return info, results, failed, progress


def sweep_comparison(tracking_uri: str | None, experiment: str, sweep: str | None,
                     export: Path | None = None) -> str:
    """comparison.md's text, rebuilt from MLflow; with `export`, each method's chosen config
    per dataset written there as `vacsr best --export` writes them (`<dataset>.<method>.yaml`)."""
    records = read_records(tracking_uri, experiment)
    parent = records.sweep_run(sweep)
    info, results, failed, progress = _inputs(records, parent)
    grouped, failed_by = by_method(info, results, failed)
    # the unfinished units' notes, by method and dataset as the failures are
    _, unfinished = by_method(info, {}, {u: unit_note(state)
                                         for u, state in progress.unfinished.items()})
    text = notice(progress) + comparison_markdown(info["spec"], build_comparison(
        info["spec"], grouped, failed_by, info["budget"], unfinished=unfinished))
    if export is not None:
        best_configs(tracking_uri, experiment, parent.data.tags[SWEEP_TAG], export)
    return text
