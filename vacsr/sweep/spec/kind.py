"""A sweep kind as data: what `sweeps/*.py` declare and the one driver runs.

A kind names its datasets, the task, the validation metric trials are selected on, the search
space, the training protocol it fixes (paper appendix C.2; never searched), the extra evaluations
of every final checkpoint (novel classes, domain shifts) and the columns of its table. Nothing in
the driver branches on a kind's name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from vacsr.sweep.spec.space import Domain


def sweep_script(kind: str) -> str:
    """The script that runs the sweeps of kind `kind` (its `--help` names it so)."""
    return f"sweeps/{kind}.py"


@dataclass(frozen=True)
class Evaluation:
    """One more test-time evaluation of each final checkpoint, kept as per-seed metric `metric`:
    `key` of `evaluate_checkpoint` on `dataset` (None: the one trained on) restricted to the
    `classes` subsample ("base", "novel" or "all")."""

    metric: str
    dataset: str | None = None
    classes: str = "all"
    key: str = "acc"


@dataclass(frozen=True)
class Compared:
    """What the comparison of several methods (`--methods`, report/comparison.md) shows and
    differences. A row per dataset with `columns` ((title, per-seed metric); the `optional`
    titles only where the per-seed results hold them), or, with `targets`, a row per evaluated
    target ((row name, per-seed metric), the trained dataset's own test first) whose one column
    is `score`. `score`: the column title that ranks the methods and whose per-seed values the
    paired bootstrap differences; with `harmonic` (two column titles) it is their harmonic mean.
    `average`: the summary row's name, the mean over `average_over` targets (empty: every row);
    the best other method is the best on it. `per_row`: a difference per row as well as the
    summary's. `setting`: (label, budget key) pairs the header names (a value of the sweep's
    config every method's budget carries)."""

    score: str
    columns: tuple[tuple[str, str], ...] = ()
    harmonic: tuple[str, str] | None = None
    optional: tuple[str, ...] = ()
    targets: tuple[tuple[str, str], ...] = ()
    average: str = "average"
    average_over: tuple[str, ...] = ()
    per_row: bool = False
    setting: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.targets and self.columns:
            raise ValueError("comparison: both columns and targets; expected one (a target's "
                             "row has the score alone)")
        titles = [title for title, _ in self.columns]
        names = [name for name, _ in self.targets]
        wrong = ([t for t in (*self.optional, *(self.harmonic or ())) if t not in titles]
                 + [t for t in self.average_over if t not in names])
        if not self.targets and not self.harmonic and self.score not in titles:
            wrong.append(self.score)
        if wrong:
            raise ValueError(f"comparison: {', '.join(wrong)} not among its columns or "
                             "targets; expected their titles")


@dataclass(frozen=True)
class Table:
    """The final table. `columns`: (title, per-seed metric) pairs, empty for every test metric;
    `harmonic`: two column titles whose harmonic mean becomes column H (base-to-novel, sec. 4.1);
    `published`: reference rows (name -> {column title: value}, H included) and what they are
    (`published_note`: "published, <note>" marks each); `comparison`: the comparison of a sweep
    of several methods."""

    columns: tuple[tuple[str, str], ...] = ()
    harmonic: tuple[str, str] | None = None
    published: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    published_note: str = ""
    comparison: Compared | None = None


@dataclass(frozen=True)
class SweepKind:
    name: str
    task: str  # "classification" | "retrieval"
    datasets: tuple[str, ...]
    metric: str  # a val/* metric: selection never looks at test
    space: Mapping[str, Domain]
    protocol: Mapping[str, Any] = field(default_factory=dict)  # fixed config values (C.2)
    train_classes: str = "all"  # data.subsample_classes of every run ("base" for base-to-novel)
    evaluations: tuple[Evaluation, ...] = ()
    averages: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # per-seed means
    table: Table = Table()
    # the batch sizes searched, per dataset
    batch_sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    also_accepts: tuple[str, ...] = ()  # dataset names accepted beyond `datasets`
    mode: str = "max"

    def __post_init__(self) -> None:
        # one rule for what is fixed: a key the protocol fixes is never searched
        both = sorted(set(self.protocol) & set(self.searched_keys))
        if both:
            raise ValueError(f"sweep kind {self.name}: its protocol fixes {', '.join(both)}, "
                             "which its space also searches; a fixed key is never searched")

    @property
    def searched_keys(self) -> tuple[str, ...]:
        """The keys the kind declares searched: its space, and the batch size where it names
        batch sizes."""
        return (*self.space, *(("train.batch_size",) if self.batch_sizes else ()))

    @property
    def experiment(self) -> str:
        return f"vacsr-{self.name}"

    def data_needed(self, datasets: list[str]) -> list[str]:
        """Every dataset a sweep over `datasets` reads: the trained ones and the evaluated ones."""
        extra = [e.dataset for e in self.evaluations if e.dataset]
        return list(dict.fromkeys([*datasets, *extra]))


__all__ = ["Compared", "Evaluation", "SweepKind", "Table"]
