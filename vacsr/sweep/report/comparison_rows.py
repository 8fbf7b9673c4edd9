"""The comparison's numbers as data: per row (a dataset, or an evaluated target: the kind's
Compared, vacsr/sweep/report/comparison_shape.py) and method the row vacsr/sweep/report/table.py
computes (each column mean ± std over the seeds, H from the seed-averaged base and novel), each
method's summary row (the average over the datasets, or over the shifted targets), the best
method per row and on the summary, and the differences in the score with their paired bootstrap
intervals (vacsr/sweep/report/comparison_differences.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from vacsr.methods.registry import METHODS, REFERENCE, ZERO_SHOT
from vacsr.sweep.report.bootstrap import BOOTSTRAP_SEED, RESAMPLES, Difference
from vacsr.sweep.report.comparison_differences import differences, present_columns
from vacsr.sweep.report.comparison_shape import (
    Shape,
    as_table_data,
    by_target,
    check_results,
    read_shape,
    summary_rows,
)
from vacsr.sweep.report.table import average_row, table_rows

SINGLE_EVALUATION = "1 evaluation (no training; seeds cannot change it)"
# in place of every best method and difference while a unit has no result yet
WITHHELD = "the sweep is unfinished"

__all__ = ["Comparison", "REFERENCE", "SINGLE_EVALUATION", "ZERO_SHOT",
           "build_comparison"]


@dataclass(frozen=True)
class Comparison:
    """What comparison.md / .csv show, as data."""
    rows: list[dict]  # per row x method (and each method's summary), table.py's numbers
    best: dict[str, str]  # row (and the summary) -> the best method by the score, or why none
    differences: tuple[Difference, ...]  # reference minus best other, minus zero-shot (per row)
    budget: dict[str, dict]  # method -> what it got
    single: frozenset[str]  # methods evaluated once per dataset (no training)
    unranked: tuple[str, ...] = ()  # methods the best other could not be, and why
    shape: Shape = field(default_factory=lambda: Shape((), "H", comparable=False))


def _named(shape: Shape, method: str, row: dict) -> dict:
    """table.py's row under the comparison's row key (its "dataset", or "target")."""
    return {shape.unit: row["dataset"], "method": method,
            **{k: v for k, v in row.items() if k != "dataset"}}


def _method_rows(shape: Shape, method: str, per_row: dict[str, dict], failed: dict[str, str],
                 single: bool, summary: list[str]) -> dict[str, dict]:
    """row (and the summary) -> the method's row: table.py's, with the method and its trials."""
    spec = shape.table_spec(present_columns(shape, per_row))
    data = as_table_data(per_row, single)
    found = table_rows(spec, data, failed)  # the rows of `data` in order, then any average
    rows = {}
    for row in [*found[:len(data)], *(r for r in found if "failed" in r)]:
        row = _named(shape, method, row)
        if "failed" not in row:
            row["num_trials"] = per_row[row[shape.unit]].get("num_trials")
            if single:
                row["note"] = SINGLE_EVALUATION
        rows[row[shape.unit]] = row
    finished = {name: data[name] for name in summary if name in data}
    average = average_row(spec, finished, shape.average) if finished else None
    if average is None:
        rows[shape.average] = {shape.unit: shape.average, "method": method, "note": (
            f"no {shape.average}: no {shape.unit} finished" if not finished
            else f"no {shape.average}: its seeds differ between {shape.unit}s")}
        return rows
    rows[shape.average] = {**_named(shape, method, average), f"{shape.unit}s": len(finished)}
    if single:
        rows[shape.average]["note"] = SINGLE_EVALUATION
    return rows


def _winners(rows: list[dict], among: list[str], score: str) -> tuple[list[str], float]:
    """The methods of `among` whose row has the highest score (all of them on a tie), and that
    score; ([], nan) when none has one."""
    scored = [(r[score], r["method"]) for r in rows if score in r and r["method"] in among]
    top = max((h for h, _ in scored), default=math.nan)
    return [m for h, m in scored if h == top], top


def _best_text(winners: list[str], top: float, none: str) -> str:
    return f"{' = '.join(winners)} ({top:.2f})" if winners else f"none: {none}"


def _best_methods(shape: Shape, rows: list[dict], names: list[str], methods: list[str],
                  results: dict[str, dict], summary: list[str]) -> dict[str, str]:
    """Row (and the summary) -> its best method by the score, or why none; the best rows marked
    `best`."""
    best = {}
    for name in names:
        winners, top = _winners([r for r in rows if r[shape.unit] == name], methods,
                                shape.score)
        best[name] = _best_text(winners, top, "no method finished it")
        for row in rows:
            if row[shape.unit] == name and shape.score in row:
                row["best"] = row["method"] in winners
    complete = [m for m in methods if all(d in results.get(m, {}) for d in summary)]
    winners, top = _winners([r for r in rows if r[shape.unit] == shape.average], complete,
                            shape.score)
    best[shape.average] = _best_text(
        winners, top, f"no method finished every {shape.unit}") + (
        f", among the methods that finished all {len(summary)} {shape.unit}(s)" if winners
        else "")
    return best


def build_comparison(spec: dict, results: dict[str, dict], failed: dict[str, dict],
                     budget: dict[str, dict], reference: str = REFERENCE,
                     zero_shot: str = ZERO_SHOT, *, resamples: int = RESAMPLES,
                     seed: int = BOOTSTRAP_SEED,
                     unfinished: dict[str, dict] | None = None) -> Comparison:
    """results[method][dataset] = {"per_seed": [{"seed": s, metric: value}], "val": best val,
    "num_trials": n}; failed[method][dataset] = one-line reason; budget[method] = what it got
    (with the values of the settings the comparison's header names). `spec`: the table spec
    (vacsr/results.py table_spec), its "comparison" saying what is compared. A method that
    trains nothing (`Method.trained`) has one evaluation per dataset, which pairs with every seed
    of the reference. unfinished[method][dataset]
    = the note of a unit with no result yet (a stopped sweep's): shown in its row, and no best
    method or difference is named until there is none."""
    shape = read_shape(spec)
    # a method that trains nothing is evaluated once per dataset: seeds cannot change it
    single = frozenset(name for found in (results, failed, unfinished or {}, budget)
                       for name in found if name in METHODS and not METHODS[name].trained)
    check_results(shape, results, single)
    results, failed, unfinished, targets = by_target(shape, results, failed, unfinished)
    methods = list(dict.fromkeys([*results, *failed, *unfinished, *budget]))
    names = list(targets)
    summary = summary_rows(shape, targets)
    by_method = {m: _method_rows(shape, m, results.get(m, {}), failed.get(m, {}), m in single,
                                 summary) for m in methods}
    rows = [by_method[m].get(d, {shape.unit: d, "method": m,
                                 "note": unfinished.get(m, {}).get(d, "not run")})
            for d in names for m in methods] + [by_method[m][shape.average] for m in methods]
    withheld = WITHHELD if any(unfinished.values()) else ""
    best = ({name: f"none: {withheld}" for name in [*names, shape.average]} if withheld
            else _best_methods(shape, rows, names, methods, results, summary))
    found, unranked = differences(shape, results, failed, targets, reference, zero_shot, single,
                                  resamples, seed, withheld)
    return Comparison(rows, best, found, budget, single, unranked, shape)
