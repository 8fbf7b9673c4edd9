"""The comparison as a reader sees it: comparison.md (the table, the best methods, the two
differences in a sentence each, the budget), the two CSVs at full precision, and a few console
lines. Numbers in the text to DIGITS decimals, as results.md."""
from __future__ import annotations

import csv
import io
import math
from typing import Any

from vacsr.results import DIGITS, VAL
from vacsr.sweep.report.bootstrap import LEVEL, Difference
from vacsr.sweep.report.comparison_rows import AVERAGE, Comparison
from vacsr.sweep.report.table import readable

# budget entries that describe a method rather than what it was given: shown, never compared
DESCRIBED = ("trains", "searched")


def _escaped(text: Any) -> str:
    """A cell's text: a `|` in a reason or a budget value would end the cell."""
    return str(text).replace("|", "\\|")


def _titles(spec: dict) -> list[str]:
    titles = [tuple(c)[0] for c in spec["columns"]]
    return titles + (["H"] if spec.get("harmonic") and "H" not in titles else [])


def _cell(row: dict, title: str) -> str:
    if row["seeds"] > 1:
        text = f"{row[title]:.{DIGITS}f} ± {row.get(f'{title}_std', 0.0):.{DIGITS}f}"
    else:
        text = f"{row[title]:.{DIGITS}f}"
    return f"**{text}**" if title == "H" and row.get("best") else text


def _table_line(row: dict, titles: list[str]) -> str:
    name = row["dataset"] if row["dataset"] != AVERAGE or "datasets" not in row \
        else f"{AVERAGE} ({row['datasets']} dataset(s))"
    if "seeds" not in row:  # failed, not run, or no average
        what = f"FAILED: {row['failed']}" if "failed" in row else row["note"]
        return f"| {name} | {row['method']} | {_escaped(what)} |" + " |" * (len(titles) + 2)
    val = row.get(VAL, math.nan)
    trials = row.get("num_trials")
    return (f"| {name} | {row['method']} | " + " | ".join(_cell(row, t) for t in titles)
            + f" | {'' if not _finite(val) else f'{val:.{DIGITS}f}'}"
            + f" | {'' if trials is None else trials} | {row.get('note', row['seeds'])} |")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def signed(value: float) -> str:
    return f"{value:+.{DIGITS}f}"


def difference_sentence(difference: Difference) -> str:
    """One plain sentence: the observed mean difference, its interval, over what, what was left
    out; or that it is not available, and why."""
    d, ref = difference, difference.reference
    if d.interval is None:
        return f"{ref}'s H minus that of {d.label}: not available ({d.reason})."
    i, pairing = d.interval, d.pairing
    left = ("no (dataset, seed) pair left out" if not pairing.left_out else
            f"{pairing.left_out} (dataset, seed) result(s) left out without a partner: "
            + "; ".join(pairing.left_out_why))
    return (f"{ref}'s H minus that of {d.other} ({d.label}): {signed(i.observed)} points, "
            f"{LEVEL}% interval [{signed(i.low)}, {signed(i.high)}] (paired bootstrap over "
            f"{i.pairs} (dataset, seed) pairs, B = {i.resamples:,} resamples, seed {i.seed}); "
            f"{left}.")


def budget_markdown(budget: dict[str, dict], single: frozenset[str]) -> str:
    """Every method's budget in one table, and whether the trained methods' budgets agree."""
    if not budget:
        return "## Budget\n\nNo budget was recorded.\n"
    keys = list(dict.fromkeys(k for given in budget.values() for k in given))
    lines = ["## Budget", "", "| method | " + " | ".join(keys) + " |",
             "|---|" + "---|" * len(keys)]
    for method, given in budget.items():
        lines.append(f"| {method} | " + " | ".join(_escaped(_budget_value(given.get(k)))
                                                 for k in keys) + " |")
    trained = [given for method, given in budget.items() if method not in single]
    differing = [k for k in keys if k not in DESCRIBED
                 and len({_budget_value(g.get(k)) for g in trained}) > 1]
    if differing:
        lines += ["", f"The trained methods' budgets differ in: {', '.join(differing)}."]
    elif len(trained) > 1:
        lines += ["", "Every trained method had the same budget."]
    return "\n".join(lines) + "\n"


def _budget_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(readable(v) for v in value)
    return readable(value)


def comparison_markdown(spec: dict, found: Comparison) -> str:
    titles = _titles(spec)
    lines = ["# Method comparison", "",
             "Per dataset each column is the mean ± std over the seeds, H the harmonic mean of "
             "the seed-averaged base and novel (its ± the spread of the per-seed H); an average "
             "row takes, per seed, the mean over the method's datasets, then mean ± std over the "
             "seeds. Bold: the best H of a dataset.", "",
             "| dataset | method | " + " | ".join(titles) + " | best val | trials | seeds |",
             "|---|---|" + "---:|" * (len(titles) + 3)]
    lines += [_table_line(row, titles) for row in found.rows]
    lines += ["", "## Best method by H", ""]
    lines += [f"- {dataset}: {best}" for dataset, best in found.best.items()]
    lines += ["", "## Differences in H", ""]
    lines += [f"- {difference_sentence(d)}" for d in found.differences]
    if found.unranked:
        lines += [f"- Not ranked as the best other method: {'; '.join(found.unranked)}."]
    lines += ["", "The interval resamples the (dataset, seed) pairs with replacement; per pair "
              "the difference of the two methods' per-seed H (the harmonic mean of that seed's "
              "base and novel); a method without training pairs its one evaluation with every "
              "seed.", ""]
    return "\n".join(lines) + "\n" + budget_markdown(found.budget, found.single)


def _csv(rows: list[dict], first: list[str]) -> str:
    fields = list(dict.fromkeys([*first, *(k for r in rows for k in r)]))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def comparison_csv(rows: list[dict]) -> str:
    """One row per dataset x method and each method's average (dataset "average"), full
    precision; a failed one has its reason in `failed`, no numbers."""
    return _csv(rows, ["dataset", "method"])


def differences_csv(differences: tuple[Difference, ...]) -> str:
    """One row per difference: the observed mean, the interval, over how many pairs, how many
    left out, B and the seed; or available=False and the reason."""
    rows = []
    for d in differences:
        i, p = d.interval, d.pairing
        rows.append({"comparison": d.label, "reference": d.reference, "other": d.other or "",
                     "available": d.available,
                     "observed": "" if i is None else i.observed,
                     "low": "" if i is None else i.low, "high": "" if i is None else i.high,
                     "level": LEVEL, "pairs": "" if i is None else i.pairs,
                     "left_out": "" if p is None else p.left_out,
                     "resamples": "" if i is None else i.resamples,
                     "seed": "" if i is None else i.seed, "reason": d.reason,
                     "left_out_why": "" if p is None else " | ".join(p.left_out_why)})
    return _csv(rows, [])


def console_summary(spec: dict, found: Comparison) -> str:
    """A few lines: each method's average row, the two differences with their intervals."""
    titles = _titles(spec)
    lines = ["method comparison (average over datasets):"]
    width = max((len(r["method"]) for r in found.rows), default=0)
    for row in (r for r in found.rows if r["dataset"] == AVERAGE):
        if "seeds" not in row:
            lines.append(f"  {row['method']:<{width}}  {row['note']}")
            continue
        cells = "  ".join(f"{t} {_cell({**row, 'best': False}, t)}" for t in titles)
        each = ", 1 evaluation each" if "note" in row else ""
        lines.append(f"  {row['method']:<{width}}  {cells}  ({row['datasets']} dataset(s){each})")
    for d in found.differences:
        if d.interval is None:
            lines.append(f"{d.reference} - {d.label}, H: not available ({d.reason})")
            continue
        i = d.interval
        lines.append(f"{d.reference} - {d.other} ({d.label}), H: {signed(i.observed)}, "
                     f"{LEVEL}% interval [{signed(i.low)}, {signed(i.high)}] over {i.pairs} "
                     f"pairs, {d.pairing.left_out} left out")
    return "\n".join(lines) + "\n"
