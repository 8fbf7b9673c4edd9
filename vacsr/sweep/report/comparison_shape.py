"""What a sweep's comparison of methods compares, read once from the table spec (the kind's
`Compared`, vacsr/sweep/spec/kind.py, as vacsr/results.py table_spec writes it, so a report
rebuilt from the MLflow store reads the same): the columns of a row, the score that ranks the
methods and is differenced, rows per dataset or per evaluated target, the summary row, and the
settings the header names. A spec without a comparison (written before kinds declared one)
compares by H where its table has one, as base-to-novel always did.

With targets, each method's per-dataset results become per-target results (`by_target`): the
target's per-seed metric under the score's name, so the rows, the ranking and the bootstrap
treat a target as they treat a dataset.
"""
from __future__ import annotations

from dataclasses import dataclass

from vacsr.errors import ConfigError
from vacsr.sweep.report.bootstrap import Score
from vacsr.sweep.report.table import readable

NO_SCORE = "the table has no harmonic mean H to compare"


@dataclass(frozen=True)
class Shape:
    """A comparison's layout as data (see Compared)."""
    columns: tuple[tuple[str, str], ...]  # (title, per-seed metric) of a row (after by_target)
    score: str  # the title of the ranked, differenced column ("H" for a harmonic mean)
    comparable: bool = True  # False: no score to rank or difference (why: NO_SCORE)
    harmonic: tuple[str, str] | None = None  # the column titles the score is the H of
    optional: tuple[str, ...] = ()  # column titles shown where every per-seed entry has them
    targets: tuple[tuple[str, str], ...] = ()  # (row name, per-seed metric); () rows per dataset
    average: str = "average"  # the summary row's name
    average_over: tuple[str, ...] = ()  # the targets it averages; (): every row
    per_row: bool = False  # a difference per row as well as the summary's
    setting: tuple[tuple[str, str], ...] = ()  # (label, budget key) the header names

    @property
    def unit(self) -> str:
        """What a row (a bootstrap pair's first half) is."""
        return "target" if self.targets else "dataset"

    @property
    def ranked(self) -> str:
        """How the best other method was chosen, in words."""
        return "on average" if self.average == "average" else f"on the {self.average}"

    def table_spec(self, columns: list[tuple[str, str]] | None = None) -> dict:
        """The spec vacsr/sweep/report/table.py computes a row from (`columns`: those present)."""
        return {"columns": [list(c) for c in (self.columns if columns is None else columns)],
                "harmonic": list(self.harmonic) if self.harmonic else None}

    def score_metrics(self) -> Score:
        """The per-seed score the bootstrap pairs: a metric, or the two H is the mean of."""
        metric = dict(self.columns)
        if self.harmonic:
            return metric[self.harmonic[0]], metric[self.harmonic[1]]
        return metric[self.score]

    def needed(self) -> list[str]:
        """The per-seed metrics every result must hold (before by_target)."""
        if self.targets:
            return [metric for _, metric in self.targets]
        return [metric for title, metric in self.columns if title not in self.optional]


def read_shape(spec: dict) -> Shape:
    """The comparison a table spec declares; its table's columns and H where it declares none."""
    declared = spec.get("comparison")
    if not declared:
        columns = tuple(tuple(c) for c in spec["columns"])
        if spec.get("harmonic"):
            return Shape(columns, "H", harmonic=tuple(spec["harmonic"]))
        return Shape(columns, "H", comparable=False)
    score = declared["score"]
    targets = tuple(tuple(t) for t in declared.get("targets") or ())
    columns = ((score, score),) if targets else tuple(tuple(c) for c in declared["columns"])
    return Shape(columns, score, harmonic=tuple(declared["harmonic"]) if declared.get(
                     "harmonic") else None,
                 optional=tuple(declared.get("optional") or ()), targets=targets,
                 average=declared.get("average") or "average",
                 average_over=tuple(declared.get("average_over") or ()),
                 per_row=bool(declared.get("per_row")),
                 setting=tuple(tuple(s) for s in declared.get("setting") or ()))


def as_table_data(per_row: dict[str, dict], single: bool) -> dict[str, dict]:
    """A method's results as table.py takes them. A single evaluation gets one seed name on
    every row: its seed may be any value, and the summary row needs equal seed lists."""
    if not single:
        return per_row
    return {d: {**r, "per_seed": [{**r["per_seed"][0], "seed": 0}]} for d, r in per_row.items()}


def check_results(shape: Shape, results: dict[str, dict], single: frozenset[str]) -> None:
    """One ConfigError line for results the comparison cannot be built from."""
    needed = shape.needed()
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


def _row_names(shape: Shape, datasets: list[str]) -> dict[tuple[str, str], str]:
    """(dataset, target) -> its row's name: the target's, or "dataset/target" where several
    datasets were trained on."""
    return {(d, t): t if len(datasets) == 1 else f"{d}/{t}"
            for d in datasets for t, _ in shape.targets}


def by_target(shape: Shape, results: dict[str, dict], failed: dict[str, dict],
              unfinished: dict[str, dict] | None = None
              ) -> tuple[dict[str, dict], dict[str, dict], dict[str, dict], dict[str, str]]:
    """(results, failed, unfinished) per method and row, and each row's target: the datasets
    themselves without targets; with them, each target's per-seed metric under the score's name
    (its selection's val and trials kept), and a failed (or unfinished) dataset's reason (note)
    on each of its targets."""
    notes = (failed, unfinished or {})
    if not shape.targets:
        rows = {d: d for group in (results, *notes) for per in group.values() for d in per}
        return results, *notes, rows
    datasets = list(dict.fromkeys(d for group in (results, *notes) for per in group.values()
                                  for d in per))
    names = _row_names(shape, datasets)
    pivoted = {method: {names[d, target]: {
        **{k: v for k, v in result.items() if k != "per_seed"},
        "per_seed": [{"seed": e["seed"], shape.score: float(e[metric])}
                     for e in result["per_seed"]]}
        for d, result in per_dataset.items() for target, metric in shape.targets}
        for method, per_dataset in results.items()}
    failing, left = ({method: {names[d, target]: why for d, why in reasons.items()
                               for target, _ in shape.targets}
                      for method, reasons in group.items()} for group in notes)
    return pivoted, failing, left, {name: target for (_, target), name in names.items()}


def summary_rows(shape: Shape, rows: dict[str, str]) -> list[str]:
    """The rows the summary averages over (`rows`: row name -> its target)."""
    if not shape.average_over:
        return list(rows)
    return [name for name, target in rows.items() if target in shape.average_over]


def setting_text(shape: Shape, budget: dict[str, dict]) -> list[str]:
    """One sentence per setting the header names: its value in every method's budget, or that
    the methods' differ, or that none recorded it."""
    lines = []
    for label, key in shape.setting:
        values = {m: given[key] for m, given in budget.items() if given.get(key) is not None}
        shown = {readable(v) for v in values.values()}
        label = label[:1].upper() + label[1:]
        if not values:
            lines.append(f"{label}: not recorded ({key}).")
        elif len(shown) == 1:
            lines.append(f"{label}: {shown.pop()} ({key}).")
        else:
            each = "; ".join(f"{m} {readable(v)}" for m, v in values.items())
            lines.append(f"{label}: differs between the methods ({each}) ({key}).")
    return lines
