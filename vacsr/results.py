"""An evaluation's results: which of its entries are results, the base-to-novel harmonic mean,
and results as text for the console (`vacsr train`, `vacsr eval`, the demo). Plain Python: the
sweep driver's table uses them without importing torch."""
from __future__ import annotations

# an evaluation's entries that count or time (vacsr/eval/evaluate.py) or name the run: not results,
# so no table column and no line on a metric's axis
NOT_RESULTS = ("seed", "eval_seconds", "num_samples")


def format_metrics(metrics: dict) -> str:
    """A two-column table of the numeric metrics, one per line."""
    rows = [(k, v) for k, v in metrics.items() if isinstance(v, (int, float))]
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k:<{width}}  {v:10.4f}" if isinstance(v, float)
                     else f"{k:<{width}}  {v:>10}"
                     for k, v in rows)


def harmonic_mean(base: float, novel: float) -> float:
    """H = 2 B N / (B + N) of base and novel accuracy (paper sec. 4.2, Table 5); 0 when both
    are 0."""
    return 0.0 if base + novel == 0 else 2.0 * base * novel / (base + novel)
