"""An evaluation's results: which of its entries are results, the base-to-novel harmonic mean,
results as text for the console (`vacsr train`, `vacsr eval`, the demo), and the final table's
conventions (its decimals, its best-val column, a kind's table as plain data) shared by the
sweep's report and the MLflow view of it. Plain Python: neither imports torch for them."""
from __future__ import annotations

# an evaluation's entries that count or time (vacsr/eval/evaluate.py) or name the run: not results,
# so no table column and no line on a metric's axis
NOT_RESULTS = ("seed", "eval_seconds", "num_samples")
DIGITS = 2  # decimals of the table's numbers (percentages), in results.md and the MLflow view
VAL = "val"  # a row's best val (the selection's), the table's "best val" column
# what a Ray run's report carries besides its metrics: the prefix cache's lines on damaged files it
# rebuilt (vacsr/model/prefix_cache.py), text the sweep's console shows; never in the history
PREFIX_CACHE_REBUILT = "prefix_cache/rebuilt"


def format_metrics(metrics: dict) -> str:
    """A two-column table of the numeric metrics, one per line."""
    rows = [(k, v) for k, v in metrics.items() if isinstance(v, (int, float))]
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k:<{width}}  {v:10.4f}" if isinstance(v, float)
                     else f"{k:<{width}}  {v:>10}" for k, v in rows)


def harmonic_mean(base: float, novel: float) -> float:
    """H = 2 B N / (B + N) of base and novel accuracy (paper sec. 4.2, Table 5); 0 when both
    are 0."""
    return 0.0 if base + novel == 0 else 2.0 * base * novel / (base + novel)


def table_spec(table) -> dict:
    """A sweep kind's Table as plain data (logged on the sweep's run: vacsr/records/artifacts.py
    SWEEP_INFO), its methods' comparison included (None where the kind declares none)."""
    compared = table.comparison
    return {"columns": [list(c) for c in table.columns],
            "harmonic": list(table.harmonic) if table.harmonic else None,
            "published": {k: dict(v) for k, v in table.published.items()},
            "published_note": table.published_note,
            "comparison": None if compared is None else {
                "score": compared.score, "columns": [list(c) for c in compared.columns],
                "harmonic": list(compared.harmonic) if compared.harmonic else None,
                "optional": list(compared.optional),
                "targets": [list(t) for t in compared.targets],
                "average": compared.average, "average_over": list(compared.average_over),
                "per_row": compared.per_row, "setting": [list(s) for s in compared.setting]}}
