"""Training-curve plots from a run's per-epoch history (the `history` list of metrics.json).

Figures are built on matplotlib's Agg canvas directly, never through pyplot, so plotting touches no
global backend state and works in headless Ray workers and tests alike.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vacsr.results import NOT_RESULTS

# History keys are "<group>/<name>": "train/*" are loss parts, "lr/*" learning rates, every other
# group is an evaluation split ("val/*", "test/*"), whose counts and times (NOT_RESULTS) are not
# drawn: 1000 samples on the axis of a percentage flattens the accuracy to a line at 0.
NON_EVAL_GROUPS = ("train", "lr")

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _series(history: Sequence[Mapping], key: str) -> tuple[list[int], list[float]]:
    """(epochs, values) of `key` over the epochs that have it (evaluation may skip epochs)."""
    points = [(int(h["epoch"]), float(h[key])) for h in history
              if key in h and isinstance(h[key], (int, float)) and not isinstance(h[key], bool)]
    return [e for e, _ in points], [v for _, v in points]


def metric_groups(history: Sequence[Mapping]) -> tuple[list[str], list[str]]:
    """(train loss keys, evaluation keys), each sorted, over every epoch of `history`."""
    keys = sorted({k for h in history for k in h if "/" in k})
    train = [k for k in keys if k.split("/", 1)[0] == "train"]
    evals = [k for k in keys if k.split("/", 1)[0] not in NON_EVAL_GROUPS
             and k.split("/", 1)[1] not in NOT_RESULTS]
    return train, evals


def _draw(ax, history: Sequence[Mapping], keys: list[str], title: str, marker: str) -> None:
    from matplotlib.ticker import MaxNLocator

    for key in keys:
        epochs, values = _series(history, key)
        ax.plot(epochs, values, marker=marker, label=key)
    ax.set_title(title)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if keys:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "nothing logged yet", ha="center", va="center", transform=ax.transAxes)


def training_curves_figure(history: Sequence[Mapping]) -> Figure:
    """Two panels: training loss parts per epoch (left), evaluation metrics per epoch (right)."""
    # here, not at the top: every process that records a run imports this module, and one
    # that stops before drawing (a dataset task stopped mid-search) needs no matplotlib
    # (0.6 CPU-s a process)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), layout="constrained")
    FigureCanvasAgg(fig)  # attaches the Agg canvas that savefig renders through
    train_ax, eval_ax = fig.subplots(1, 2)
    train_keys, eval_keys = metric_groups(history)
    _draw(train_ax, history, train_keys, "training loss parts", marker=".")
    _draw(eval_ax, history, eval_keys, "evaluation metrics", marker="o")
    return fig


def plot_training_curves(history: Sequence[Mapping], path: str | Path) -> Path:
    """Write the training curves of `history` to the PNG file `path`; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    training_curves_figure(history).savefig(path, format="png", dpi=100)
    return path
