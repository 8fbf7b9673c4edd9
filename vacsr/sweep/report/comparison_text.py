"""The comparison as a reader sees it: comparison.md (the settings its header names, the table,
the best methods, the differences in a sentence each, the budget), the two CSVs at full
precision, and a few console lines. Numbers in the text to DIGITS decimals, as results.md; the
words follow the kind's comparison (vacsr/sweep/report/comparison_shape.py): its rows' unit, its
score, its summary row."""
from __future__ import annotations

import csv
import io
import math
from typing import Any

from vacsr.results import DIGITS, VAL
from vacsr.sweep.report.bootstrap import BCA, BCA_MIN_PAIRS, LEVEL, Difference
from vacsr.sweep.report.comparison_budget import budget_markdown, escaped
from vacsr.sweep.report.comparison_rows import Comparison
from vacsr.sweep.report.comparison_shape import Shape, setting_text
from vacsr.sweep.report.table import published_cells, published_note, published_rows

# a row's entries that are no column of the table
BOOKKEEPING = ("method", "seeds", VAL, "num_trials", "note", "best", "failed")


def _titles(shape: Shape, rows: list[dict]) -> list[str]:
    # an optional column (ECCV Caption's, on COCO's 5K test set alone) where some row holds it
    titles = [title for title, _ in shape.columns
              if title not in shape.optional or any(title in r for r in rows)]
    if not shape.columns:  # a table of every test metric: those of its first finished row
        first = next((r for r in rows if "seeds" in r), {})
        titles = [k for k in first if k not in (shape.unit, f"{shape.unit}s", *BOOKKEEPING)
                  and not k.endswith("_std")]
    return titles + ([shape.score] if shape.harmonic and shape.score not in titles else [])


def _cell(row: dict, title: str, score: str) -> str:
    if title not in row:  # an optional column this method's results lack
        return ""
    if row["seeds"] > 1:
        text = f"{row[title]:.{DIGITS}f} ± {row.get(f'{title}_std', 0.0):.{DIGITS}f}"
    else:
        text = f"{row[title]:.{DIGITS}f}"
    return f"**{text}**" if title == score and row.get("best") else text


def _table_line(row: dict, titles: list[str], shape: Shape) -> str:
    unit, count = shape.unit, f"{shape.unit}s"
    name = row[unit] if row[unit] != shape.average or count not in row \
        else f"{shape.average} ({row[count]} {unit}(s))"
    if "seeds" not in row:  # failed, not run, or no average
        what = f"FAILED: {row['failed']}" if "failed" in row else row["note"]
        return f"| {name} | {row['method']} | {escaped(what)} |" + " |" * (len(titles) + 2)
    val = row.get(VAL, math.nan)
    trials = row.get("num_trials")
    return (f"| {name} | {row['method']} | "
            + " | ".join(_cell(row, t, shape.score) for t in titles)
            + f" | {'' if not _finite(val) else f'{val:.{DIGITS}f}'}"
            + f" | {'' if trials is None else trials} | {row.get('note', row['seeds'])} |")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def signed(value: float) -> str:
    return f"{value:+.{DIGITS}f}"


def _scope(difference: Difference, shape: Shape) -> str:
    """Where the difference is, after the score's name: "" over every dataset."""
    target = difference.target
    if target is None:
        return ""
    return f" on the {target}" if target == shape.average else f" on {target}"


def _pair(difference: Difference, shape: Shape) -> str:
    """What one bootstrap pair is: a seed within one row, else a (row, seed) pair."""
    one_row = difference.target not in (None, shape.average)
    return "seed" if one_row else f"({shape.unit}, seed) pair"


def difference_sentence(difference: Difference, shape: Shape) -> str:
    """One plain sentence: the observed mean difference, its interval, over what, what was left
    out; or that it is not available, and why."""
    d, ref = difference, difference.reference
    what = f"{ref}'s {shape.score}{_scope(d, shape)}"
    if d.interval is None:
        return f"{what} minus that of {d.label}: not available ({d.reason})."
    i, pairing, pair = d.interval, d.pairing, _pair(d, shape)
    unit = pair.removesuffix(" pair")
    left = (f"no {pair} left out" if not pairing.left_out else
            f"{pairing.left_out} {unit} result(s) left out without a partner: "
            + "; ".join(pairing.left_out_why))
    method = "BCa" if i.method == BCA else \
        f"percentile: BCa needs {BCA_MIN_PAIRS} or more pairs that differ"
    return (f"{what} minus that of {d.other} ({d.label}): {signed(i.observed)} points, "
            f"{LEVEL}% interval [{signed(i.low)}, {signed(i.high)}] (paired bootstrap over "
            f"{i.pairs} {pair}s, {method}, B = {i.resamples:,} resamples, seed {i.seed}); "
            f"{left}.")


def _intro(shape: Shape) -> str:
    unit, score, average = shape.unit, shape.score, shape.average
    per = f"Per {unit}" + (" (the trained dataset's own test set, then each other evaluation "
                           "of the same checkpoints)" if shape.targets else "")
    text = f"{per} each column is the mean ± std over the seeds"
    if shape.harmonic:
        a, b = shape.harmonic
        text += (f", {score} the harmonic mean of the seed-averaged {a} and {b} (its ± the "
                 f"spread of the per-seed {score})")
    over = ", ".join(shape.average_over) or f"the method's {unit}s"
    article = "an" if average[:1] in "aeiou" else "a"
    return (f"{text}; {article} {average} row takes, per seed, the mean over {over}, then mean "
            f"± std over the seeds. Bold: the best {score} of a {unit}.")


def _footer(shape: Shape) -> str:
    pairs = f"({shape.unit}, seed) pairs"
    text = (f"A {shape.unit}'s interval resamples its seeds, the {shape.average}'s its {pairs}, "
            "with replacement" if shape.per_row
            else f"The interval resamples the {pairs} with replacement")
    text += f"; per pair the difference of the two methods' per-seed {shape.score}"
    if shape.harmonic:
        text += f" (the harmonic mean of that seed's {shape.harmonic[0]} and {shape.harmonic[1]})"
    return text + "; a method without training pairs its one evaluation with every seed."


def comparison_markdown(spec: dict, found: Comparison) -> str:
    """comparison.md. `spec`: the table spec the comparison was built from (its shape is
    `found.shape`)."""
    shape = found.shape
    titles = _titles(shape, found.rows)
    setting = setting_text(shape, found.budget)
    lines = ["# Method comparison", "", *([" ".join(setting), ""] if setting else []),
             _intro(shape), "",
             f"| {shape.unit} | method | " + " | ".join(titles)
             + " | best val | trials | seeds |",
             "|---|---|" + "---:|" * (len(titles) + 3)]
    lines += [_table_line(row, titles, shape) for row in found.rows]
    lines += ["", f"## Best method by {shape.score}", ""]
    lines += [f"- {name}: {best}" for name, best in found.best.items()]
    lines += ["", f"## Differences in {shape.score}", ""]
    lines += [f"- {difference_sentence(d, shape)}" for d in found.differences]
    if found.unranked:
        lines += [f"- Not ranked as the best other method: {'; '.join(found.unranked)}."]
    lines += ["", _footer(shape), ""]
    return ("\n".join(lines) + "\n" + budget_markdown(found.budget, found.single)
            + _published_section(spec))


def _published_section(spec: dict) -> str:
    """The kind's published rows (their papers' numbers for the real datasets), after the
    comparison and apart from it: nothing above was measured under their conditions."""
    titles = [title for title, _ in spec.get("columns", [])] + (["H"] if spec.get("harmonic")
                                                                 else [])
    rows = published_rows(spec, titles)
    if not rows:
        return ""
    keys = list(dict.fromkeys(key for values in rows.values() for key in values))
    # a target's metric reads as the target, as in the comparison above
    targets = {metric: name for name, metric in (spec.get("comparison") or {}).get("targets", [])}
    lines = ["", f"## Published ({published_note(spec).removeprefix('published, ')})", "",
             "Each row as its paper reports it, on the real datasets: not measured here, under "
             "neither this sweep's budget nor its model and data.", "",
             "| method | " + " | ".join(targets.get(key, key) for key in keys) + " |",
             "|---|" + "---:|" * len(keys)]
    lines += [f"| {name} | " + " | ".join(published_cells(values, keys)) + " |"
              for name, values in rows.items()]
    return "\n".join(lines) + "\n"


def _csv(rows: list[dict], first: list[str]) -> str:
    fields = list(dict.fromkeys([*first, *(k for r in rows for k in r)]))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def comparison_csv(rows: list[dict], unit: str = "dataset") -> str:
    """One row per row name (a dataset, or a target: `unit`) x method and each method's summary,
    full precision; a failed one has its reason in `failed`, no numbers."""
    return _csv(rows, [unit, "method"])


def differences_csv(differences: tuple[Difference, ...]) -> str:
    """One row per difference: over what (`target`, where it is not every dataset), the observed
    mean, the interval, over how many pairs, how many left out, B and the seed; or
    available=False and the reason."""
    rows = []
    for d in differences:
        i, p = d.interval, d.pairing
        rows.append({"comparison": d.label,
                     **({} if d.target is None else {"target": d.target}),
                     "reference": d.reference, "other": d.other or "",
                     "available": d.available,
                     "observed": "" if i is None else i.observed,
                     "low": "" if i is None else i.low, "high": "" if i is None else i.high,
                     "level": LEVEL, "pairs": "" if i is None else i.pairs,
                     "left_out": "" if p is None else p.left_out,
                     "resamples": "" if i is None else i.resamples,
                     "method": "" if i is None else i.method,
                     "seed": "" if i is None else i.seed, "reason": d.reason,
                     "left_out_why": "" if p is None else " | ".join(p.left_out_why)})
    return _csv(rows, [])


def console_summary(spec: dict, found: Comparison) -> str:
    """A few lines: the settings, each method's summary row, the summary's differences with their
    intervals."""
    shape = found.shape
    titles = _titles(shape, found.rows)
    lines = [f"method comparison ({shape.average} over {shape.unit}s):",
             *(f"  {line}" for line in setting_text(shape, found.budget))]
    width = max((len(r["method"]) for r in found.rows), default=0)
    for row in (r for r in found.rows if r[shape.unit] == shape.average):
        if "seeds" not in row:
            lines.append(f"  {row['method']:<{width}}  {row['note']}")
            continue
        cells = "  ".join(f"{t} {_cell({**row, 'best': False}, t, shape.score)}"
                          for t in titles if t in row)
        each = ", 1 evaluation each" if "note" in row else ""
        lines.append(f"  {row['method']:<{width}}  {cells}  ({row[f'{shape.unit}s']} "
                     f"{shape.unit}(s){each})")
    for d in (d for d in found.differences if d.target in (None, shape.average)):
        what = f"{shape.score}{_scope(d, shape)}"
        if d.interval is None:
            lines.append(f"{d.reference} - {d.label}, {what}: not available ({d.reason})")
            continue
        i = d.interval
        lines.append(f"{d.reference} - {d.other} ({d.label}), {what}: {signed(i.observed)}, "
                     f"{LEVEL}% interval [{signed(i.low)}, {signed(i.high)}] over {i.pairs} "
                     f"pairs, {d.pairing.left_out} left out")
    return "\n".join(lines) + "\n"
