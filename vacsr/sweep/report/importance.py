"""What a dataset's search teaches (paper appendix E, its sensitivity analysis of alpha, beta,
gamma, K and N_h): the importance of each searched key for the selection metric, and the metric
against each key's value over the search's finished trials (the slice plots of E.1-E.3).

Read from the dataset's Optuna study alone (public API: `optuna.importance`), so it describes the
trials exactly as the sampler saw them: a trial ASHA stopped early counts with the value it
reported last (it is drawn hollow in the slice plots).

Importance is PED-ANOVA (`optuna.importance.PedAnovaImportanceEvaluator`, Optuna's default): per
key, how far the values of the best quarter of the trials are from those of all trials. Optuna's
documentation asks for at least 5 trials in that top quantile for a stable estimate, so below
`MIN_FINISHED_TRIALS` = 5 / 0.25 = 20 finished trials no importance is computed and the reports
say so; the slices (raw observations) are drawn whatever the count.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vacsr.atomic import atomic_write, atomic_write_json
from vacsr.records.artifacts import IMPORTANCE_DIR, IMPORTANCE_FILE, IMPORTANCE_PLOT
from vacsr.sweep.plan.folders import importance_folder
from vacsr.sweep.report.table import readable
from vacsr.sweep.spec.space import Choice, Domain, Int, LogFloat

TOP_QUANTILE = 0.25  # importance = what it takes to reach the best quarter of the trials
MIN_TOP_TRIALS = 5  # Optuna's PED-ANOVA docs: at least 5 trials above the target quantile
MIN_FINISHED_TRIALS = math.ceil(MIN_TOP_TRIALS / TOP_QUANTILE)  # 20
METHOD = f"PED-ANOVA (optuna.importance), top {TOP_QUANTILE:.0%} of the finished trials"
FOLDER = IMPORTANCE_DIR  # under the report folder and the dataset run's artifacts
METRIC_PREFIX = "importance/"


@dataclass
class Sensitivity:
    """One dataset's analysis as plain data (importance.json)."""

    dataset: str
    metric: str
    mode: str
    keys: dict[str, dict]  # searched key -> its domain: {"scale": log|linear|int|choice, ...}
    trials: list[dict]  # finished trials: number, value, params, epochs, stopped_early, selected
    importance: dict[str, float] | None = None  # key -> share of importance, sums to 1
    message: str | None = None  # why importance is absent
    method: str = METHOD
    min_trials: int = MIN_FINISHED_TRIALS

    def top(self, n: int = 2) -> list[tuple[str, float]]:
        if not self.importance:
            return []
        return sorted(self.importance.items(), key=lambda kv: -kv[1])[:n]

    def summary(self) -> dict:
        """What results.md needs (kept in sweep_state.json with the dataset's result)."""
        return {"finished_trials": len(self.trials), "min_trials": self.min_trials,
                "top": [list(kv) for kv in self.top()], "message": self.message}

    @classmethod
    def from_json(cls, payload: dict) -> "Sensitivity":
        return cls(**{k: payload[k] for k in cls.__dataclass_fields__ if k in payload})


def domain_info(domain: Domain) -> dict:
    if isinstance(domain, Choice):
        return {"scale": "choice", "choices": list(domain.options)}
    scale = "log" if isinstance(domain, LogFloat) else "int" if isinstance(domain, Int) \
        else "linear"
    return {"scale": scale, "low": domain.low, "high": domain.high}


def _finished(study) -> list:
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and math.isfinite(t.value)]


def analyse_study(study, dataset: str, space: dict[str, Domain], *, metric: str, mode: str,
                  planned_epochs: int, selected: dict[str, Any] | None = None) -> Sensitivity:
    """The analysis of one study. `planned_epochs`: a trial's epochs when train.epochs is not
    searched; `selected`: the chosen config's values of the searched keys (marked in the plots)."""
    import optuna

    trials = _finished(study)
    points = []
    for t in trials:
        epochs = int(t.params.get("train.epochs", planned_epochs))
        points.append({"number": t.number, "value": float(t.value), "params": dict(t.params),
                       "epochs": len(t.intermediate_values) or epochs,
                       "stopped_early": 0 < len(t.intermediate_values) < epochs,
                       # a key the trial did not draw (its condition failed) chose nothing
                       "selected": bool(selected) and all(
                           t.params[k] == v for k, v in selected.items() if k in t.params)})
    result = Sensitivity(dataset=dataset, metric=metric, mode=mode,
                         keys={k: domain_info(d) for k, d in space.items()}, trials=points)
    if len(trials) < MIN_FINISHED_TRIALS:
        result.message = (f"{len(trials)} finished trial(s), fewer than the {MIN_FINISHED_TRIALS} "
                          f"an importance estimate needs ({MIN_TOP_TRIALS} in the top "
                          f"{TOP_QUANTILE:.0%}): not estimated")
        return result
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=TOP_QUANTILE)
    # the keys every finished trial drew: Optuna estimates over the trials that hold all the
    # keys asked for, so a conditional key would silently shrink the trials of every key
    present = [k for k in space if all(k in t.params for t in trials)]
    values = optuna.importance.get_param_importances(study, evaluator=evaluator, params=present)
    result.importance = {k: float(values.get(k, 0.0)) for k in present}
    return result


# ------------------------------------------------------------------ the figure
def _slice(axes, sensitivity: Sensitivity, key: str) -> None:
    """The metric against one key's value, one point per finished trial (colour: trial order)."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize
    from matplotlib.ticker import MaxNLocator, NullFormatter

    info = sensitivity.keys[key]
    points = [p for p in sensitivity.trials if key in p["params"]]
    if info["scale"] == "choice":
        labels = [str(c) for c in info["choices"]]
        xs = [labels.index(str(p["params"][key])) if str(p["params"][key]) in labels else -1
              for p in points]
        axes.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        axes.set_xlim(-0.5, len(labels) - 0.5)
    else:  # the key's whole range, wherever the trials fell in it
        xs = [p["params"][key] for p in points]
        low, high = info["low"], info["high"]
        if info["scale"] == "log":
            axes.set_xscale("log")
            axes.xaxis.set_minor_formatter(NullFormatter())  # they overlap on a short range
            axes.set_xlim(low / (high / low) ** 0.05, high * (high / low) ** 0.05)
        elif info["scale"] == "int":
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))
            axes.set_xlim(low - 0.5, high + 0.5)
        else:
            axes.set_xlim(low - 0.05 * (high - low), high + 0.05 * (high - low))
    numbers = [p["number"] for p in sensitivity.trials] or [0]
    colours = colormaps["viridis"](Normalize(min(numbers), max(numbers) + 1e-9)(
        [p["number"] for p in points]))
    for stopped in (False, True):
        chosen = [i for i, p in enumerate(points) if p["stopped_early"] == stopped]
        if chosen:
            axes.scatter([xs[i] for i in chosen], [points[i]["value"] for i in chosen], s=22,
                         facecolors="none" if stopped else colours[chosen],
                         edgecolors=colours[chosen])
    for i, p in enumerate(points):
        if p["selected"]:
            axes.scatter([xs[i]], [p["value"]], marker="*", s=140, c="red", zorder=3)
    share = (sensitivity.importance or {}).get(key)
    axes.set_title(key + (f"  ({share:.2f})" if share is not None else ""), fontsize=9)
    axes.tick_params(labelsize=7)


def _bars(axes, sensitivity: Sensitivity) -> None:
    axes.set_title(f"importance for {sensitivity.metric}", fontsize=9)
    if not sensitivity.importance:
        axes.axis("off")
        # wrapped to the panel's width here: matplotlib's wrap=True wraps at the figure's edge,
        # and the layout then squeezes every panel around one long line
        axes.text(0.5, 0.5, textwrap.fill(sensitivity.message or "", 42), ha="center",
                  va="center", fontsize=8, transform=axes.transAxes)
        return
    ranked = sorted(sensitivity.importance.items(), key=lambda kv: kv[1])
    axes.barh([k for k, _ in ranked], [v for _, v in ranked], color="tab:blue")
    axes.tick_params(labelsize=7)
    axes.set_xlabel("share (PED-ANOVA)", fontsize=8)


def plot_sensitivity(sensitivity: Sensitivity, path: Path) -> Path:
    """One PNG: the importance bars, then a slice plot per searched key (appendix E's figures)."""
    figure = sensitivity_figure(sensitivity)
    return atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=100))


def sensitivity_figure(sensitivity: Sensitivity):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = list(sensitivity.keys)
    columns = 4
    rows = math.ceil((len(keys) + 1) / columns)
    figure = Figure(figsize=(3.2 * columns, 2.6 * rows))
    FigureCanvasAgg(figure)
    _bars(figure.add_subplot(rows, columns, 1), sensitivity)
    for index, key in enumerate(keys, start=2):
        axes = figure.add_subplot(rows, columns, index)
        _slice(axes, sensitivity, key)
        if (index - 1) % columns == 0 or index == 2:  # the first slice of each row
            axes.set_ylabel(sensitivity.metric, fontsize=8)
    figure.suptitle(f"{sensitivity.dataset}: {len(sensitivity.trials)} finished trials "
                    "(colour: trial order; hollow: stopped early; star: selected)", fontsize=10)
    figure.tight_layout()
    return figure


# ------------------------------------------------------------------ the sweep's hook
def record_sensitivity(plan, dataset: str, tracker, selected: dict[str, Any]) -> dict:
    """Analyse the dataset's study, write importance.json / importance.png under
    <sweep>/report/importance/<dataset>/, log them (and one metric per key) on the dataset's
    MLflow run held by `tracker`; returns the summary results.md shows."""
    import optuna

    from vacsr.sweep.plan.studies import open_optuna_storage, study_name

    storage = open_optuna_storage(plan)
    try:
        study = optuna.load_study(study_name=study_name(plan.name, dataset), storage=storage)
        sensitivity = analyse_study(study, dataset, plan.spaces[dataset], metric=plan.kind.metric,
                                    mode=plan.kind.mode,
                                    planned_epochs=plan.configs[dataset].train.epochs,
                                    selected=selected)
    finally:
        storage.engine.dispose()
    folder = importance_folder(plan.storage, dataset)
    json_path = atomic_write_json(folder / IMPORTANCE_FILE, asdict(sensitivity))
    png_path = plot_sensitivity(sensitivity, folder / IMPORTANCE_PLOT)
    tracker.log_artifact(json_path, FOLDER)
    tracker.log_artifact(png_path, FOLDER)
    if sensitivity.importance:
        tracker.log_values({f"{METRIC_PREFIX}{k}": v for k, v in sensitivity.importance.items()})
    tracker.set_tag("vacsr.top_keys", top_keys_text(sensitivity.summary()))
    return sensitivity.summary()


def top_keys_text(summary: dict) -> str:
    if not summary.get("top"):
        return (f"{summary['finished_trials']} trials finished; an importance estimate needs "
                f"{summary['min_trials']}")
    return ", ".join(f"{k} ({v:.2f})" for k, v in summary["top"])


def importance_section(results: dict[str, dict], metric: str) -> str:
    """results.md's summary: per dataset the two most important searched keys."""
    rows = {d: r["importance"] for d, r in results.items() if r.get("importance")}
    if not rows:
        return ""
    lines = [f"\n## What mattered: importance of the searched keys for {metric}\n",
             f"{METHOD}; below {MIN_FINISHED_TRIALS} finished trials it is not estimated "
             f"(fewer than {MIN_TOP_TRIALS} trials in the top quarter is noise). Figures and "
             f"tables: `{FOLDER}/<dataset>/`.\n",
             "| dataset | finished trials | most important | second |", "|---|---:|---|---|"]
    for dataset, summary in rows.items():
        top = summary.get("top") or []
        if not top:
            lines.append(f"| {dataset} | {summary['finished_trials']} | "
                         f"not estimated (fewer than {summary['min_trials']}) | |")
            continue
        cells = [f"{k} ({v:.2f})" for k, v in top] + [""] * (2 - len(top))
        lines.append(f"| {dataset} | {summary['finished_trials']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def importance_table(analyses: list[Sensitivity]) -> str:
    """`vacsr best --importance`: searched keys x datasets (share of importance), from the
    importance.json of each dataset run."""
    if not analyses:
        return "no dataset run of this sweep holds an importance analysis\n"
    metric = analyses[0].metric
    missing = [a for a in analyses if not a.importance]
    note = (f"not estimated: {', '.join(f'{a.dataset} {len(a.trials)}' for a in missing)} of "
            f"the {MIN_FINISHED_TRIALS} finished trials an estimate needs" if missing else None)
    estimated = [a for a in analyses if a.importance]
    if not estimated:  # one line, not a grid of blanks
        return f"importance for {metric}: {note}\n"
    keys = list(dict.fromkeys(k for a in estimated for k in a.keys))
    lines = ["| key | " + " | ".join(a.dataset for a in estimated) + " |",
             "|---|" + "---:|" * len(estimated)]
    for key in keys:
        cells = [readable(a.importance[key], 3) if key in a.importance else "-"
                 for a in estimated]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines.append("| *finished trials* | " + " | ".join(str(len(a.trials)) for a in estimated)
                 + " |")
    return "\n".join([f"importance for {metric} ({METHOD})", "", *lines,
                      *([note] if note else [])]) + "\n"
