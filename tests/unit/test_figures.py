"""The figures a run and a sweep write show what they name: the training curves keep counts off
the accuracy axis, and the importance figure's text lies inside its canvas (nothing clipped)."""
from __future__ import annotations

from vacsr.plots import training_curves_figure
from vacsr.sweep.report.importance import (
    MIN_FINISHED_TRIALS,
    Sensitivity,
    plot_sensitivity,
    sensitivity_figure,
)

KEYS = {"loss.alpha_kl": {"scale": "log", "low": 1e-4, "high": 1e-1},
        "adapter.num_components": {"scale": "int", "low": 1, "high": 8},
        "model.trainable_image_blocks": {"scale": "int", "low": 0, "high": 1},
        "model.trainable_text_blocks": {"scale": "int", "low": 0, "high": 1},
        "data.batch_size": {"scale": "choice", "choices": [8, 16, 32]}}


def _texts(figure):
    """The texts a reader sees: titles, axis labels, the tick labels in view, legends, notes."""
    for axes in figure.axes:
        yield from (axes.title, axes.xaxis.label, axes.yaxis.label, *axes.texts)
        for axis in (axes.xaxis, axes.yaxis):  # a tick outside the view is not drawn
            low, high = sorted(axis.get_view_interval())
            yield from (label for at, label in zip(axis.get_majorticklocs(),
                                                   axis.get_majorticklabels())
                        if low <= at <= high)
        if axes.get_legend() is not None:
            yield from axes.get_legend().get_texts()
    yield from figure.texts
    if figure._suptitle is not None:
        yield figure._suptitle


def _text_outside(figure) -> list[str]:
    """Every visible, non-empty text of the drawn figure whose extent leaves the canvas."""
    canvas = figure.canvas
    canvas.draw()
    renderer = canvas.get_renderer()
    width, height = canvas.get_width_height()
    outside = []
    for text in _texts(figure):
        if not text.get_visible() or not text.get_text().strip():
            continue
        box = text.get_window_extent(renderer)
        if box.x0 < -0.5 or box.y0 < -0.5 or box.x1 > width + 0.5 or box.y1 > height + 0.5:
            outside.append(text.get_text())
    return outside


def test_training_curves_draw_results_not_counts_on_the_evaluation_axis():
    history = [{"epoch": e, "train/loss": 2.0 / e, "train/kl": 0.1 / e, "lr/group0": 1e-3,
                "val/acc": 30.0 + 10 * e, "val/num_samples": 1000.0, "val/eval_seconds": 0.4,
                "val/sigma_top1_mean": 0.2} for e in range(1, 4)]
    figure = training_curves_figure(history)
    train_ax, eval_ax = figure.axes
    assert [line.get_label() for line in train_ax.get_lines()] == ["train/kl", "train/loss"]
    assert [line.get_label() for line in eval_ax.get_lines()] == ["val/acc",
                                                                  "val/sigma_top1_mean"]
    low, high = eval_ax.get_ylim()
    assert high < 100, (low, high)  # the accuracy's range, not the sample count's
    assert _text_outside(figure) == []


def _sensitivity(trials: int, importance: bool) -> Sensitivity:
    points = [{"number": n, "value": 20.0 + n, "epochs": 4, "stopped_early": n % 2 == 1,
               "selected": n == 0,
               "params": {"loss.alpha_kl": 10 ** (-1 - n % 3), "adapter.num_components": 1 + n % 8,
                          "model.trainable_image_blocks": n % 2,
                          "model.trainable_text_blocks": (n + 1) % 2,
                          "data.batch_size": [8, 16, 32][n % 3]}} for n in range(trials)]
    result = Sensitivity(dataset="fgvc_aircraft", metric="val/acc", mode="max", keys=KEYS,
                         trials=points)
    if importance:
        result.importance = {k: 1 / len(KEYS) for k in KEYS}
    else:
        result.message = (f"{trials} finished trial(s), fewer than the {MIN_FINISHED_TRIALS} an "
                          "importance estimate needs (5 in the top 25%): not estimated")
    return result


def test_the_importance_figure_keeps_its_text_inside_the_canvas(tmp_path):
    from PIL import Image

    for trials, importance in ((2, False), (MIN_FINISHED_TRIALS, True)):
        sensitivity = _sensitivity(trials, importance)
        figure = sensitivity_figure(sensitivity)
        assert _text_outside(figure) == [], trials
        titles = " ".join(a.get_title() for a in figure.axes)
        assert all(key in titles for key in KEYS), titles
        blocks = next(a for a in figure.axes if a.get_title().startswith("model.trainable_text"))
        assert blocks.get_xlim() == (-0.5, 1.5)  # the key's whole range, not the drawn values
        path = plot_sensitivity(sensitivity, tmp_path / f"{trials}.png")
        assert Image.open(path).size == figure.canvas.get_width_height()
