"""Several few-shot CLIP methods side by side on one sweep's datasets and budget
(`sweeps/*.py --methods`): comparison.md, comparison.csv and comparison_differences.csv in the
report folder, in the form the sweep kind declares (its Table's `Compared`: base-to-novel's H
per dataset, domain generalisation's accuracy per target and on the shifted average,
retrieval's RSUM). Per row and method each column as mean ± std over the seeds (the numbers
vacsr/sweep/report/table.py computes, so the two reports never disagree), a summary row per
method, the best method per row and on the summary, and the reference's score minus the best
other method's and minus zero-shot's, each with a 95% paired bootstrap interval over (row, seed)
pairs (vacsr/sweep/report/bootstrap.py).

Plain data in (a table spec, per-seed metrics per method and dataset, failures, budgets), so the
same report can be rebuilt from the MLflow store alone.
"""
from __future__ import annotations

from pathlib import Path

from vacsr.atomic import atomic_write_text
from vacsr.sweep.plan.folders import COMPARISON_CSV, COMPARISON_DIFFERENCES_CSV, COMPARISON_MD
from vacsr.sweep.report.bootstrap import BOOTSTRAP_SEED, RESAMPLES
from vacsr.sweep.report.comparison_rows import REFERENCE, ZERO_SHOT, Comparison, build_comparison
from vacsr.sweep.report.comparison_text import (
    comparison_csv,
    comparison_markdown,
    console_summary,
    differences_csv,
)

__all__ = ["Comparison", "build_comparison", "write_comparison"]


def write_comparison(spec: dict, results: dict[str, dict], failed: dict[str, dict],
                     budget: dict[str, dict], folder: Path, reference: str = REFERENCE,
                     zero_shot: str = ZERO_SHOT, *, resamples: int = RESAMPLES,
                     seed: int = BOOTSTRAP_SEED,
                     preface: str = "") -> tuple[list[dict], list[Path], str]:
    """comparison.md (`preface` before it: a rehearsal's header), comparison.csv (row x method
    rows and each method's summary) and comparison_differences.csv (the differences) in
    `folder`, each written whole; returns the rows, the paths and a short console summary."""
    found = build_comparison(spec, results, failed, budget, reference, zero_shot,
                             resamples=resamples, seed=seed)
    folder = Path(folder)
    paths = [atomic_write_text(folder / COMPARISON_MD, preface + comparison_markdown(spec, found)),
             atomic_write_text(folder / COMPARISON_CSV,
                               comparison_csv(found.rows, found.shape.unit)),
             atomic_write_text(folder / COMPARISON_DIFFERENCES_CSV,
                               differences_csv(found.differences))]
    return found.rows, paths, console_summary(spec, found)
