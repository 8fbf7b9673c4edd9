"""The report of a sweep that runs several methods (`--methods`): each method's own table
(report/methods/<method>/results.md, as a one-method sweep writes it) and the comparison of all of
them (report/comparison.md, vacsr/sweep/report/comparison.py) under the budget each got."""
from __future__ import annotations

from pathlib import Path

from vacsr.config import flatten
from vacsr.methods.registry import METHODS
from vacsr.results import table_spec
from vacsr.sweep.plan.plan import SweepPlan
from vacsr.sweep.report.comparison import write_comparison
from vacsr.sweep.report.importance import importance_section
from vacsr.sweep.report.table import readable, write_report

METHODS_FOLDER = "methods"


def method_budget(plan: SweepPlan, unit: str) -> dict:
    """What one unit's method got: the same for every trained method of a sweep (the trials,
    seeds, epochs, shots and selection), what it searched, and the config values the kind's
    comparison names in its header (`Compared.setting`: the retrieval sweep's noise ratio)."""
    config, space = plan.configs[unit], plan.spaces[unit]
    compared = plan.kind.table.comparison
    setting = [key for _, key in compared.setting] if compared else []
    values = flatten(config) if setting else {}
    epochs = space.get("train.epochs")
    return {"trials": plan.trials_of(unit), "seeds": list(plan.seeds_of(unit)),
            "epochs": (f"{epochs.low}-{epochs.high}" if epochs is not None
                       else readable(config.train.epochs)),
            "shots": config.data.shots, "selection": plan.kind.metric,
            # the frozen methods train on unaugmented images (their features computed once)
            "augment": "on" if config.data.augment else "off",
            "trains": METHODS[plan.method_of(unit)].trains,
            "searched": ", ".join(space) or "nothing",
            **{key: values.get(key) for key in setting}}


def comparison_info(plan: SweepPlan) -> dict:
    """What the comparison is built from besides the units' results, as plain data (logged on
    the sweep's run, COMPARISON_INFO, so `vacsr best --compare` rebuilds the report from the
    store alone): the table spec, each method's budget, the methods, and each unit's method and
    dataset, in the sweep's order."""
    budget = {}
    for method in plan.methods:
        first = next(u for u in plan.datasets if plan.method_of(u) == method)
        budget[method] = method_budget(plan, first)
    return {"spec": table_spec(plan.kind.table), "budget": budget, "methods": list(plan.methods),
            "units": {u: {"method": plan.method_of(u), "dataset": plan.dataset_of(u)}
                      for u in plan.datasets}}


def by_method(info: dict, results: dict[str, dict], failed: dict[str, str]
              ) -> tuple[dict[str, dict], dict[str, dict]]:
    """The units' results and failures (by unit) as the comparison takes them: results[method]
    [dataset] and failed[method][dataset], every method present, in the sweep's order."""
    grouped: dict[str, dict] = {m: {} for m in info["methods"]}
    failed_by: dict[str, dict] = {m: {} for m in info["methods"]}
    for unit, where in info["units"].items():
        if unit in results:
            grouped[where["method"]][where["dataset"]] = results[unit]
        if unit in failed:
            failed_by[where["method"]][where["dataset"]] = failed[unit]
    return grouped, failed_by


def write_method_reports(plan: SweepPlan, results: dict[str, dict], failed: dict[str, str],
                         folder: Path, preface: str = ""
                         ) -> tuple[list[dict], list[Path], str, list[dict]]:
    """Each method's tables, then the comparison, each Markdown file opening with `preface`;
    returns the units' rows (named by unit, for their runs' table/* metrics; no average over
    methods), every path, the console text (after `preface`) and the comparison's rows (for its
    MLflow view)."""
    rows, paths = [], []
    for method in plan.methods:
        units = [u for u in plan.datasets if plan.method_of(u) == method]
        own = {u: results[u] for u in units if u in results}
        own_failed = {u: failed[u] for u in units if u in failed}
        if not own and not own_failed:
            continue
        method_rows, method_paths, _ = write_report(
            plan.kind, own, own_failed, folder / METHODS_FOLDER / method,
            sections=importance_section(own, plan.kind.metric), preface=preface)
        rows += [r for r in method_rows if r["dataset"] != "average"]
        paths += method_paths
    info = comparison_info(plan)
    grouped, failed_by = by_method(info, results, failed)
    compared, comparison_paths, text = write_comparison(info["spec"], grouped, failed_by,
                                                        info["budget"], folder, preface=preface)
    return rows, paths + comparison_paths, preface + text, compared
