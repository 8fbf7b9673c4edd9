"""The comparison's differences: the reference method's score minus that of the best other
method (best on the summary row: the average over the datasets, or over the shifted targets)
and minus zero-shot's, each with its paired bootstrap interval (vacsr/sweep/report/bootstrap.py)
over the summary's (row, seed) pairs, and, where the kind asks (`per_row`), over each row's
seeds as well.
"""
from __future__ import annotations

from vacsr.sweep.report.bootstrap import Difference, compare
from vacsr.sweep.report.comparison_shape import NO_SCORE, Shape, as_table_data, summary_rows
from vacsr.sweep.report.table import average_row

ZERO_SHOT_LABEL = "the zero-shot baseline"


def best_label(shape: Shape) -> str:
    """What the best other method is to the reader."""
    return f"the best other method {shape.ranked}"


def present_columns(shape: Shape, per_row: dict[str, dict]) -> list[tuple[str, str]]:
    """A method's columns: every column, an optional one only where each of its per-seed entries
    has a number for it (ECCV Caption's mAP@R needs COCO 5K's ids)."""
    entries = [e for result in per_row.values() for e in result["per_seed"]]
    return [(title, metric) for title, metric in shape.columns
            if title not in shape.optional
            or (entries and all(isinstance(e.get(metric), (int, float)) for e in entries))]


def _summary_score(shape: Shape, per_row: dict[str, dict], single: bool) -> float | None:
    per_row = as_table_data(per_row, single)
    row = average_row(shape.table_spec(present_columns(shape, per_row)), per_row)
    return None if row is None else row.get(shape.score)


def best_other(shape: Shape, results: dict[str, dict], reference: str, single: frozenset[str],
               summary: list[str]) -> tuple[str | None, str, tuple[str, ...]]:
    """The method other than the reference with the highest summary score over the summary's
    rows the reference finished, among those that finished all of them: (its name or None, why
    none, the methods that could not be ranked and why)."""
    mine = [d for d in summary if d in results.get(reference, {})]
    if not mine:
        return None, f"{reference} has no results", ()
    scored, unfit = [], []
    for method, per_row in results.items():
        lacking = [d for d in mine if d not in per_row]
        value = None if method == reference or lacking else _summary_score(
            shape, {d: per_row[d] for d in mine}, method in single)
        if value is not None:
            scored.append((value, method))
        elif method != reference:
            unfit.append(f"{method} lacks {', '.join(lacking)}" if lacking
                         else f"{method}'s seeds differ between {shape.unit}s")
    if not scored:
        return None, (f"no other method finished every {shape.unit} {reference} finished"
                      + (f": {'; '.join(unfit)}" if unfit else "")), ()
    return max(scored, key=lambda s: s[0])[1], "", tuple(unfit)


def _only(groups: dict[str, dict], names: list[str]) -> dict[str, dict]:
    return {m: {d: r for d, r in per.items() if d in names} for m, per in groups.items()}


def differences(shape: Shape, results: dict[str, dict], failed: dict[str, dict],
                targets: dict[str, str], reference: str, zero_shot: str,
                single: frozenset[str], resamples: int, seed: int, withheld: str = ""
                ) -> tuple[tuple[Difference, ...], tuple[str, ...]]:
    """(reference minus the best other, minus zero-shot) per row where the shape asks, then over
    the summary's rows; and the methods the best other could not be. `targets`: row -> its
    target (a dataset's row: the dataset). `withheld`: why none is computed (an unfinished
    sweep's are not yet its results)."""
    label = best_label(shape)
    reason = withheld or ("" if shape.comparable else NO_SCORE)
    if reason:
        return (Difference(label, reference, None, reason=reason),
                Difference(ZERO_SHOT_LABEL, reference, zero_shot, reason=reason)), ()
    summary = summary_rows(shape, targets)
    other, why, unranked = best_other(shape, results, reference, single, summary)
    scopes = [(name, [name]) for name in targets] if shape.per_row else []
    scopes.append((shape.average if shape.per_row else None, summary))
    found = []
    for target, names in scopes:
        part, part_failed = _only(results, names), _only(failed, names)
        for title, name, missing in ((label, other, why), (ZERO_SHOT_LABEL, zero_shot, "")):
            found.append(compare(title, reference, name, part, part_failed,
                                 shape.score_metrics(), single, resamples, seed,
                                 missing=missing, target=target, unit=shape.unit))
    return tuple(found), unranked
