"""The sweep's console progress and final table, without a cluster."""
from __future__ import annotations

import io
import math

from vacsr.sweep.report.progress import SweepProgress
from vacsr.sweep.report.table import table_rows, to_markdown

SPEC = {"columns": [["base", "acc"], ["novel", "novel_acc"]], "harmonic": ["base", "novel"],
        "published": {"MMA": [83.2, 76.8, 79.87]}}


def _results():
    return {"eurosat": {"val": 50.0, "per_seed": [{"seed": 1, "acc": 80.0, "novel_acc": 40.0},
                                                  {"seed": 2, "acc": 60.0, "novel_acc": 80.0}]},
            "dtd": {"val": 30.0, "per_seed": [{"seed": 1, "acc": 50.0, "novel_acc": 50.0},
                                              {"seed": 2, "acc": 50.0, "novel_acc": 50.0}]}}


def test_table_gives_mean_and_std_over_seeds_and_an_average_over_datasets():
    rows = table_rows(SPEC, _results(), {"sun397": "none of 2 trial(s) reported val/acc"})
    eurosat, dtd, average, failed = rows
    assert (eurosat["base"], eurosat["base_std"]) == (70.0, 10.0)
    assert (eurosat["novel"], eurosat["novel_std"]) == (60.0, 20.0)
    assert math.isclose(eurosat["H"], 2 * 70 * 60 / 130)  # from the averages, not mean of H
    assert dtd["base_std"] == 0.0
    # per seed, the mean over datasets; then mean and std over seeds
    assert (average["base"], average["base_std"]) == (60.0, 5.0)
    assert failed == {"dataset": "sun397", "failed": "none of 2 trial(s) reported val/acc"}
    text = to_markdown(SPEC, rows)
    assert "| eurosat | 70.00 ± 10.00 | 60.00 ± 20.00 | 64.62 ± " in text
    assert "| sun397 | FAILED: none of 2 trial(s) reported val/acc |" in text
    # a sweep recorded before published rows named their columns: read in the columns' order
    assert "| *MMA (published, 11-dataset avg.)* | 83.20 | 76.80 | 79.87 | | |" in text


def test_published_rows_fill_the_columns_they_name_marked_as_what_they_are():
    """The domain-generalisation table has a column per test metric: the paper's Table 4 rows
    fill ImageNet's and the shifts' accuracies and their average, the rest stays blank."""
    from sweeps.domain_generalization import SWEEP as DG
    from vacsr.results import table_spec

    spec = table_spec(DG.table)
    results = {"imagenet": {"val": 50.0, "per_seed": [
        {"seed": 1, "acc": 70.0, "imagenetv2_acc": 60.0, "imagenet_sketch_acc": 40.0,
         "imagenet_a_acc": 30.0, "imagenet_r_acc": 50.0, "ood_avg_acc": 45.0, "ece": 0.1}]}}
    text = to_markdown(spec, table_rows(spec, results))
    header = text.splitlines()[0]
    assert header.startswith("| dataset | acc | imagenetv2_acc |") and "ece" in header
    assert ("| *VACSR (paper) (published, Table 4, ViT-B/16, real data, each its own tuning)* | "
            "74.30 | 65.70 | 49.70 | 52.40 | 78.40 | 61.60 |  | | |") in text
    assert sum("(published, Table 4," in line for line in text.splitlines()) == 8


def test_every_metric_is_a_column_when_the_kind_names_none():
    results = {"coco": {"val": 400.0, "per_seed": [
        {"seed": 1, "rsum": 400.0, "i2t_r1": 50.0, "eval_seconds": 3.0}]}}
    rows = table_rows({"columns": [], "harmonic": None, "published": {}}, results)
    assert len(rows) == 1 and rows[0]["rsum"] == 400.0 and "eval_seconds" not in rows[0]
    assert "| coco | 400.00 | 50.00 | 400.00 | 1 |" in to_markdown(
        {"columns": [], "harmonic": None, "published": {}}, rows)


def test_progress_in_a_log_has_no_control_characters():
    stream = io.StringIO()  # not a terminal: plain lines, no tqdm bar
    progress = SweepProgress("demo", ["eurosat", "dtd"], 2, [], "val/acc", stream=stream,
                             interval_s=0.0)
    progress.started("eurosat")
    progress.event({"event": "trial", "dataset": "eurosat", "trial": "t1", "status": "done",
                    "epochs": 4, "value": 55.0, "cache": (300, 400)})
    progress.event({"event": "final", "dataset": "eurosat", "seed": 1,
                    "metrics": {"acc": 60.0, "novel_acc": 40.0, "eval_seconds": 0.1},
                    "cache": (1200, 1600)})
    progress.finished("eurosat")
    progress.finished("dtd", "none of 2 trial(s) reported val/acc")
    progress.close()
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    assert "[demo] eurosat: trial 1 done after 4 epoch(s), val/acc=55.00" in text
    assert "[demo] eurosat final seed 1: acc=60.00, novel_acc=40.00\n" in text
    assert "progress: 1/4 trials, ETA" in text and "best val/acc: eurosat=55.0" in text
    assert "[demo] dtd: FAILED: none of 2 trial(s) reported val/acc" in text
    # once, at the end: the trials' and final seeds' evaluation inputs the prefix cache served
    assert text.count("prefix cache:") == 1 and text.endswith(
        "[demo] prefix cache: served 1,500 of the 2,000 images and prompts that evaluation "
        "passes encoded (75%)\n")
