"""The sweep's final table, in the base-to-novel literature's conventions: per dataset each column
as mean ± std over the seeds (CoOp's parse_test_res.py), H from the seed-averaged base and novel
(paper sec. 4.1), an average row, published rows beside; Markdown, CSV, a per-seed CSV and a chart.

Everything here works from plain data (a table spec, vacsr/results.py, and per-seed metrics),
so `vacsr best --table` rebuilds the same table from the MLflow store alone.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from statistics import mean, pstdev
from typing import Any

from vacsr.atomic import atomic_write, atomic_write_text
from vacsr.results import DIGITS, NOT_RESULTS, VAL, harmonic_mean, table_spec
from vacsr.sweep.plan.folders import PER_SEED_CSV, RESULTS_CSV, RESULTS_MD, RESULTS_PNG

HIDDEN = NOT_RESULTS  # per-seed entries that are not results


def readable(value: Any, digits: int = 4) -> str:
    """A value as a person reads it: floats (and MLflow's float strings) to `digits` significant
    digits; ints, bools, names and lists as they are. Stored records keep full precision."""
    if isinstance(value, str):
        try:
            int(value)
            return value
        except ValueError:
            pass
        try:
            value = float(value)
        except ValueError:
            return value
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.{digits}g}"
    return str(value)


def _columns(spec: dict, results: dict[str, dict]) -> list[tuple[str, str]]:
    if spec["columns"]:
        return [tuple(c) for c in spec["columns"]]
    keys = None
    for result in results.values():
        for row in result["per_seed"]:
            names = [k for k in row if k not in HIDDEN and not k.startswith("uncertainty_")]
            keys = names if keys is None else [k for k in keys if k in names]
    return [(k, k) for k in keys or []]


def _spread(values: list[float]) -> tuple[float, float]:
    return mean(values), pstdev(values) if len(values) > 1 else 0.0


def _row(name: str, seeds: list[dict], columns, harmonic) -> dict:
    """A dataset (or the average over datasets) from its per-seed values."""
    row: dict[str, Any] = {"dataset": name, "seeds": len(seeds)}
    for title, metric in columns:
        row[title], row[f"{title}_std"] = _spread([s[metric] for s in seeds])
    if harmonic:
        a, b = harmonic
        row["H"] = harmonic_mean(row[a], row[b])  # from the averages, as the papers report
        row["H_std"] = _spread([harmonic_mean(s[dict(columns)[a]], s[dict(columns)[b]])
                                for s in seeds])[1]
    return row


def average_row(spec: dict, results: dict[str, dict], name: str = "average") -> dict | None:
    """The row `name` over the datasets of `results`: per seed, the mean over them, then mean ±
    std over the seeds (H from the averaged columns); None without results or when their seed
    lists differ."""
    columns, harmonic = _columns(spec, results), spec.get("harmonic")
    seed_lists = [[s["seed"] for s in r["per_seed"]] for r in results.values()]
    if not results or any(s != seed_lists[0] for s in seed_lists):
        return None
    # per seed, the mean over datasets: the average row's spread is over seeds too
    per_seed = [{"seed": seed, **{m: mean(r["per_seed"][i][m] for r in results.values())
                                  for _, m in columns}}
                for i, seed in enumerate(seed_lists[0])]
    return {**_row(name, per_seed, columns, harmonic), VAL: math.nan}


def table_rows(spec: dict, results: dict[str, dict], failed: dict[str, str] | None = None
               ) -> list[dict]:
    """results[dataset] = {"per_seed": [{"seed": s, metric: value}], "val": best val}."""
    columns, harmonic = _columns(spec, results), spec.get("harmonic")
    rows = []
    for dataset, result in results.items():
        rows.append({**_row(dataset, result["per_seed"], columns, harmonic),
                     VAL: result.get("val", math.nan)})
    if len(results) > 1 or harmonic:
        average = average_row(spec, results)
        if average is not None:
            rows.append(average)
    for dataset, why in (failed or {}).items():
        rows.append({"dataset": dataset, "failed": why})
    return rows


def _cell(row: dict, title: str) -> str:
    std = row.get(f"{title}_std", 0.0)
    return f"{row[title]:.{DIGITS}f} ± {std:.{DIGITS}f}" if row["seeds"] > 1 \
        else f"{row[title]:.{DIGITS}f}"


def to_markdown(spec: dict, rows: list[dict]) -> str:
    titles = [t for t, _ in [tuple(c) for c in spec["columns"]]] or [
        k for k in next((r for r in rows if "failed" not in r), {"dataset": 0, "seeds": 0})
        if k not in ("dataset", "seeds", VAL) and not k.endswith("_std")]
    if spec.get("harmonic") and "H" not in titles:
        titles.append("H")
    lines = ["| dataset | " + " | ".join(titles) + " | best val | seeds |",
             "|---|" + "---:|" * (len(titles) + 2)]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['dataset']} | FAILED: {r['failed']} |" + " |" * (len(titles) + 1))
            continue
        val = "" if math.isnan(r[VAL]) else f"{r[VAL]:.{DIGITS}f}"  # none on the average
        lines.append(f"| {r['dataset']} | " + " | ".join(_cell(r, t) for t in titles)
                     + f" | {val} | {r['seeds']} |")
    note = published_note(spec)
    for name, values in published_rows(spec, titles).items():
        lines.append(f"| *{name} ({note})* | " + " | ".join(published_cells(values, titles))
                     + " | | |")
    return "\n".join(lines) + "\n"


# what an earlier sweep's stored spec (a list of values, base-to-novel's alone) says
_EARLIER_NOTE = "11-dataset avg."


def published_note(spec: dict) -> str:
    """How the published rows are marked: "published, <the kind's note>"."""
    return f"published, {spec.get('published_note') or _EARLIER_NOTE}"


def published_cells(values: dict[str, float], keys: list[str]) -> list[str]:
    """A published row's cells under `keys`, blank where it gives no value."""
    return ["" if values.get(key) is None else f"{values[key]:.2f}" for key in keys]


def published_rows(spec: dict, titles: list[str]) -> dict[str, dict[str, float]]:
    """The spec's published rows as name -> {column title: value}; an earlier sweep's stored
    spec holds each as a list in the columns' order."""
    return {name: values if isinstance(values, dict) else dict(zip(titles, values))
            for name, values in spec.get("published", {}).items()}


def _csv(rows: list[dict]) -> str:
    fields = list(dict.fromkeys(k for r in rows for k in r))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def per_seed_rows(results: dict[str, dict]) -> list[dict]:
    return [{"dataset": d, **s} for d, r in results.items() for s in r["per_seed"]]


def plot_columns(spec: dict, rows: list[dict], path: Path) -> Path:
    """Grouped bars of the table's columns (and H) per dataset, with the seed spread."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [r for r in rows if "failed" not in r]
    titles = [c[0] for c in spec["columns"]] + (["H"] if spec.get("harmonic") else [])
    figure = Figure(figsize=(max(6, 0.9 * len(rows) + 2), 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    width = 0.8 / max(len(titles), 1)
    for i, title in enumerate(titles):
        offset = (i - (len(titles) - 1) / 2) * width
        axes.bar([j + offset for j in range(len(rows))], [r[title] for r in rows], width,
                 yerr=[r.get(f"{title}_std", 0.0) for r in rows], label=title)
    axes.set_xticks(range(len(rows)), [r["dataset"] for r in rows], rotation=40, ha="right")
    axes.set_ylabel("test (%)")
    axes.set_title("mean ± std over seeds")
    axes.legend()
    figure.tight_layout()
    return atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=110))


def write_report(kind, results: dict[str, dict], failed: dict[str, str], folder: Path,
                 sections: str = "", preface: str = "") -> tuple[list[dict], list[Path], str]:
    """results.md / results.csv / per_seed.csv (+ a chart when the kind names its columns);
    `sections`: markdown appended to results.md after the table (the importance summary);
    `preface`: markdown before it (a rehearsal's header)."""
    spec = table_spec(kind.table)
    rows = table_rows(spec, results, failed)
    text = preface + to_markdown(spec, rows) + sections
    paths = [atomic_write_text(folder / RESULTS_MD, text),
             atomic_write_text(folder / RESULTS_CSV, _csv(rows)),
             atomic_write_text(folder / PER_SEED_CSV, _csv(per_seed_rows(results)))]
    if spec["columns"] and any("failed" not in r for r in rows):
        paths.append(plot_columns(spec, rows, folder / RESULTS_PNG))
    return rows, paths, text
