"""The sweep's final table: per dataset base / novel / H from seed-averaged accuracies, the
average row (H from the averaged base and novel), published rows beside, CSV + Markdown + chart."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from statistics import mean

from vacsr.eval.metrics import harmonic_mean

# 11-dataset averages (base, novel, H) as published (paper Table 5 and the cited papers).
PUBLISHED = {
    "zero-shot CLIP": (69.34, 74.22, 71.70), "CoCoOp": (80.47, 71.69, 75.83),
    "MaPLe": (82.28, 75.14, 78.55), "MMA": (83.20, 76.80, 79.87), "MMRL": (85.68, 77.16, 81.20),
    "VACSR (paper)": (85.74, 76.08, 80.37),
}


def base_novel_rows(results: dict[str, dict]) -> list[dict]:
    """results[dataset] = {"base": [per seed], "novel": [per seed], "val": best val} -> rows."""
    rows = []
    for dataset, result in results.items():
        base, novel = mean(result["base"]), mean(result["novel"])
        rows.append({"dataset": dataset, "base": base, "novel": novel,
                     "H": harmonic_mean(base, novel), "val": result.get("val", float("nan")),
                     "seeds": len(result["base"])})
    if rows:
        base, novel = mean(r["base"] for r in rows), mean(r["novel"] for r in rows)
        rows.append({"dataset": "average", "base": base, "novel": novel,
                     "H": harmonic_mean(base, novel), "val": float("nan"),
                     "seeds": min(r["seeds"] for r in rows)})
    return rows


def to_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["dataset"])
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def to_markdown(rows: list[dict], published: dict | None = PUBLISHED) -> str:
    lines = ["| dataset | base | novel | H | best val | seeds |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        val = "" if math.isnan(r["val"]) else f"{r['val']:.2f}"  # no val on the average row
        lines.append(f"| {r['dataset']} | {r['base']:.2f} | {r['novel']:.2f} | {r['H']:.2f} | "
                     f"{val} | {r['seeds']} |")
    for name, (base, novel, h) in (published or {}).items():
        lines.append(f"| *{name} (published, 11-dataset avg.)* | {base:.2f} | {novel:.2f} | "
                     f"{h:.2f} | | |")
    return "\n".join(lines) + "\n"


def plot_base_novel(rows: list[dict], path: Path) -> Path:
    """Grouped bars of base, novel and H per dataset (and the average)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(max(6, 0.9 * len(rows) + 2), 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    width = 0.27
    for offset, key in ((-width, "base"), (0.0, "novel"), (width, "H")):
        axes.bar([i + offset for i in range(len(rows))], [r[key] for r in rows], width, label=key)
    axes.set_xticks(range(len(rows)), [r["dataset"] for r in rows], rotation=40, ha="right")
    axes.set_ylabel("accuracy (%)")
    axes.set_title("base-to-novel: base / novel / H (seed-averaged)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return Path(path)


def write_table(rows: list[dict], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = folder / "results.csv", folder / "results.md"
    csv_path.write_text(to_csv(rows))
    md_path.write_text(to_markdown(rows))
    return [csv_path, md_path, plot_base_novel(rows, folder / "base_novel_h.png")]
