"""The comparison's numbers as data: per dataset and method the row vacsr/sweep/report/table.py
computes (each column mean ± std over the seeds, H from the seed-averaged base and novel), each
method's average row, the best method per dataset and on average, and the two differences in H
with their paired bootstrap intervals (vacsr/sweep/report/bootstrap.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from vacsr.errors import ConfigError
from vacsr.sweep.report.bootstrap import BOOTSTRAP_SEED, RESAMPLES, Difference, compare
from vacsr.sweep.report.table import table_rows

REFERENCE, ZERO_SHOT = "vacsr", "zero_shot"
AVERAGE = "average"  # the dataset cell of a method's average row
SINGLE_EVALUATION = "1 evaluation (no training; seeds cannot change it)"
BEST_OTHER, ZERO_SHOT_LABEL = "the best other method on average", "the zero-shot baseline"


@dataclass(frozen=True)
class Comparison:
    """What comparison.md / .csv show, as data."""
    rows: list[dict]  # per dataset x method (and each method's average), table.py's numbers
    best: dict[str, str]  # dataset (and AVERAGE) -> the best method by H, or why there is none
    differences: tuple[Difference, Difference]  # reference minus best other, minus zero-shot
    budget: dict[str, dict]  # method -> what it got
    single: frozenset[str]  # methods evaluated once per dataset (no training)
    unranked: tuple[str, ...] = ()  # methods the best other could not be, and why


def _harmonic_metrics(spec: dict) -> tuple[str, str] | None:
    """The per-seed metric names of H's two columns (base, novel); None when the table has no
    H."""
    if not spec.get("harmonic"):
        return None
    metric = {title: name for title, name in (tuple(c) for c in spec["columns"])}
    return metric[spec["harmonic"][0]], metric[spec["harmonic"][1]]


def _check(spec: dict, results: dict[str, dict], single: frozenset[str]) -> None:
    """One ConfigError line for results the table cannot be built from."""
    needed = [name for _, name in (tuple(c) for c in spec["columns"])]
    for method, per_dataset in results.items():
        for dataset, result in per_dataset.items():
            where = f"results[{method!r}][{dataset!r}]"
            per_seed = result.get("per_seed") if isinstance(result, dict) else None
            if not per_seed:
                raise ConfigError(f"{where}: no per_seed entries; expected at least one "
                                  "evaluation (a method that failed there belongs in `failed`)")
            if method in single and len(per_seed) != 1:
                raise ConfigError(f"{where}: {len(per_seed)} per_seed entries; expected one "
                                  "evaluation (the method has no training)")
            for i, entry in enumerate(per_seed):
                absent = [n for n in needed if not isinstance(entry.get(n), (int, float))]
                if absent or "seed" not in entry:
                    raise ConfigError(f"{where} per_seed[{i}]: no number for "
                                      f"{', '.join(absent) or 'seed'}; expected seed and "
                                      f"{', '.join(needed)}")


def _as_table_data(per_dataset: dict[str, dict], single: bool) -> dict[str, dict]:
    """A method's results as table.py takes them. A single evaluation gets one seed name on
    every dataset: its seed may be any value, and the average row needs equal seed lists."""
    if not single:
        return per_dataset
    return {d: {**r, "per_seed": [{**r["per_seed"][0], "seed": 0}]}
            for d, r in per_dataset.items()}


def _method_rows(spec: dict, method: str, per_dataset: dict[str, dict],
                 failed: dict[str, str], single: bool) -> dict[str, dict]:
    """dataset (and AVERAGE) -> the method's row: table.py's, with the method and its trials."""
    rows = {}
    for row in table_rows(spec, _as_table_data(per_dataset, single), failed):
        row = {"dataset": row["dataset"], "method": method, **row}
        if "failed" not in row and row["dataset"] in per_dataset and row["dataset"] != AVERAGE:
            row["num_trials"] = per_dataset[row["dataset"]].get("num_trials")
        elif row["dataset"] == AVERAGE:
            row["datasets"] = len(per_dataset)
        if single and "failed" not in row:
            row["note"] = SINGLE_EVALUATION
        rows[row["dataset"]] = row
    if AVERAGE not in rows:
        rows[AVERAGE] = {"dataset": AVERAGE, "method": method, "note": (
            "no average: no dataset finished" if not per_dataset
            else "no average: its seeds differ between datasets")}
    return rows


def _winners(rows: list[dict], among: list[str]) -> tuple[list[str], float]:
    """The methods of `among` whose row has the highest H (all of them on a tie), and that H;
    ([], nan) when none has an H."""
    scored = [(r["H"], r["method"]) for r in rows if "H" in r and r["method"] in among]
    top = max((h for h, _ in scored), default=math.nan)
    return [m for h, m in scored if h == top], top


def _best_text(winners: list[str], top: float, none: str) -> str:
    return f"{' = '.join(winners)} ({top:.2f})" if winners else f"none: {none}"


def _average_h(spec: dict, per_dataset: dict[str, dict], single: bool) -> float | None:
    rows = table_rows(spec, _as_table_data(per_dataset, single))
    return rows[-1]["H"] if rows and rows[-1]["dataset"] == AVERAGE else None


def best_other(spec: dict, results: dict[str, dict], reference: str,
               single: frozenset[str]) -> tuple[str | None, str, tuple[str, ...]]:
    """The method other than the reference with the highest average H over the datasets the
    reference finished, among those that finished all of them: (its name or None, why none,
    the methods that could not be ranked and why)."""
    mine = list(results.get(reference, {}))
    if not mine:
        return None, f"{reference} has no results", ()
    scored, unfit = [], []
    for method, per_dataset in results.items():
        lacking = [d for d in mine if d not in per_dataset]
        h = None if method == reference or lacking else _average_h(
            spec, {d: per_dataset[d] for d in mine}, method in single)
        if h is not None:
            scored.append((h, method))
        elif method != reference:
            unfit.append(f"{method} lacks {', '.join(lacking)}" if lacking
                         else f"{method}'s seeds differ between datasets")
    if not scored:
        return None, (f"no other method finished every dataset {reference} finished"
                      + (f": {'; '.join(unfit)}" if unfit else "")), ()
    return max(scored, key=lambda s: s[0])[1], "", tuple(unfit)


def build_comparison(spec: dict, results: dict[str, dict], failed: dict[str, dict],
                     budget: dict[str, dict], reference: str = REFERENCE,
                     zero_shot: str = ZERO_SHOT, *, resamples: int = RESAMPLES,
                     seed: int = BOOTSTRAP_SEED) -> Comparison:
    """results[method][dataset] = {"per_seed": [{"seed": s, metric: value}], "val": best val,
    "num_trials": n}; failed[method][dataset] = one-line reason; budget[method] = what it got.
    `zero_shot`'s one evaluation per dataset pairs with every seed of the reference."""
    single = frozenset({zero_shot})
    _check(spec, results, single)
    methods = list(dict.fromkeys([*results, *failed, *budget]))
    datasets = list(dict.fromkeys(d for group in (results, failed) for per in group.values()
                                  for d in per))
    by_method = {m: _method_rows(spec, m, results.get(m, {}), failed.get(m, {}), m in single)
                 for m in methods}
    rows = [by_method[m].get(d, {"dataset": d, "method": m, "note": "not run"})
            for d in datasets for m in methods] + [by_method[m][AVERAGE] for m in methods]
    best = {}
    for dataset in datasets:
        winners, top = _winners([r for r in rows if r["dataset"] == dataset], methods)
        best[dataset] = _best_text(winners, top, "no method finished it")
        for row in rows:
            if row["dataset"] == dataset and "H" in row:
                row["best"] = row["method"] in winners
    complete = [m for m in methods if all(d in results.get(m, {}) for d in datasets)]
    winners, top = _winners([r for r in rows if r["dataset"] == AVERAGE], complete)
    best[AVERAGE] = _best_text(winners, top, "no method finished every dataset") + (
        f", among the methods that finished all {len(datasets)} dataset(s)" if winners else "")
    differences, unranked = _differences(spec, results, failed, reference, zero_shot, single,
                                         resamples, seed)
    return Comparison(rows, best, differences, budget, single, unranked)


def _differences(spec: dict, results: dict[str, dict], failed: dict[str, dict], reference: str,
                 zero_shot: str, single: frozenset[str], resamples: int, seed: int
                 ) -> tuple[tuple[Difference, Difference], tuple[str, ...]]:
    metrics = _harmonic_metrics(spec)
    if metrics is None:
        why = "the table has no harmonic mean H to compare"
        return (Difference(BEST_OTHER, reference, None, reason=why),
                Difference(ZERO_SHOT_LABEL, reference, zero_shot, reason=why)), ()
    other, why, unranked = best_other(spec, results, reference, single)
    return (compare(BEST_OTHER, reference, other, results, failed, metrics, single, resamples,
                    seed, missing=why),
            compare(ZERO_SHOT_LABEL, reference, zero_shot, results, failed, metrics, single,
                    resamples, seed)), unranked
