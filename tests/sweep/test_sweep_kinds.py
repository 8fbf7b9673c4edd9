"""The retrieval and domain-generalisation sweeps end to end on a local Ray (two trials one after
the other in one reused trial actor, then one trial): the same machinery as base-to-novel with
their own spaces, metrics and final evaluations. (A base-to-novel sweep whose --set fixes searched
keys is tests/reliability/test_sweep_tracking_down.py's.)"""
from __future__ import annotations

import pytest

from sweeps.domain_generalization import SWEEP as DG
from sweeps.retrieval import SWEEP as RETRIEVAL
from vacsr.distributed.worker_gpus import WORKERS_FILE, read_workers

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(900)]


def _runs(uri: str, experiment: str):
    import mlflow

    mlflow.set_tracking_uri(uri)
    return mlflow.search_runs(experiment_names=[experiment])


def _sweep(kind, tmp_path, weights, extra: list[str]) -> tuple[int, str]:
    from vacsr.sweep.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--storage", str(tmp_path), "--tracking-uri", uri, "--pretrained", str(weights),
            "--trials", "1", "--seeds", "1", "--set", "train.epochs=1", *extra]
    return main(kind, argv), uri


def test_retrieval_sweep(tmp_path, ray_local, weights, capsys):
    """--methods all: VACSR, the sigmoid baseline, zero-shot CLIP (one evaluation) and CLIP's
    contrastive fine-tuning, two seeds, a comparison row each. A unit's two trials run one after
    the other, the second in the first's actor (a trial takes one CPU: two units at a time)."""
    import csv

    import optuna

    methods = ("vacsr", "sigmoid_baseline", "zero_shot", "clip_contrastive")
    code, uri = _sweep(RETRIEVAL, tmp_path / "ret", weights,
                       ["--range", "model.trainable_image_blocks=int:0:0",
                        "--range", "model.trainable_text_blocks=int:0:0", "--methods", "all",
                        "--trials", "2", "--seeds", "1,2", "--cpus-per-worker", "1"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    folder = tmp_path / "ret" / "retrieval"
    for method in methods:
        table = (folder / "report" / "methods" / method / "results.md").read_text()
        assert f"| coco.{method} |" in table and "rsum" in table, method
    rows = list(csv.DictReader((folder / "report" / "comparison.csv").open()))
    coco = {r["method"]: r for r in rows if r["dataset"] == "coco"}
    assert set(coco) == set(methods) and not [m for m, r in coco.items() if r.get("failed")], coco
    runs = _runs(uri, "vacsr-retrieval")
    assert runs["tags.vacsr.method"].notna().all()  # every run names its method
    studies = f"sqlite:///{folder / 'optuna.db'}"
    for method in methods:
        unit = runs[runs["tags.vacsr.dataset"] == f"coco.{method}"].iloc[0]
        assert unit["tags.vacsr.method"] == method and unit.status == "FINISHED"
        assert unit["metrics.best_val/rsum"] > 0 and unit["metrics.table/rsum"] > 0
        children = runs[runs["tags.mlflow.parentRunId"] == unit.run_id]
        assert (children["tags.vacsr.method"] == method).all()
        finals = children[children["tags.mlflow.runName"].str.contains("final")]
        trials = children[~children.run_id.isin(finals.run_id)]
        study = optuna.load_study(study_name=f"retrieval-coco.{method}", storage=studies)
        if method == "zero_shot":  # nothing searched or trained: one evaluation
            assert len(study.trials) == len(trials) == len(finals) == 1
            assert coco[method]["note"].startswith("1 evaluation"), coco[method]
            assert unit["metrics.table/rsum"] == round(unit["metrics.test_seed/rsum"], 2)
            continue
        assert len(study.trials) == len(trials) == 2 and len(finals) == 2
        # a trial ASHA stopped is KILLED (Tune ended it inside tune.report), never FAILED
        assert set(trials.status) <= {"FINISHED", "KILLED"}, list(trials.status)
        assert (finals.status == "FINISHED").all()
        folders = sorted((folder / "trials" / f"coco.{method}").glob(f"*/{WORKERS_FILE}"))
        pids = {read_workers(f.parent)[0]["pid"] for f in folders}
        assert len(folders) == 2 and len(pids) == 1, pids  # one actor process, reused
    # CLIP's learned temperature trained and reached the trial's record
    contrastive = runs[runs["tags.vacsr.method"] == "clip_contrastive"]
    assert contrastive["metrics.train/logit_scale"].notna().any()
    _compared_from_store(uri, "vacsr-retrieval", folder / "report", capsys)


def _small_imagenet(root):
    """A synthetic ImageNet of 50 classes and its four shifts (A and R: 10 classes each) in
    their real layouts: the sweep's path is the 1,000-class one's (vacsr/data/imagenet.py) at a
    twentieth of the images and class prompts (CoCoOp's cost grows with both: its prompts are
    encoded per image and class)."""
    from vacsr.data.generate import write_imagenet, write_imagenet_variant
    from vacsr.data.imagenet import VARIANTS

    write_imagenet(root, classes=50, train_per_class=4, test_per_class=1)
    for name in VARIANTS:
        write_imagenet_variant(root, name, classes=50)
    return root


def test_domain_generalization_sweep(tmp_path, ray_local, weights, capsys):
    """Every method on ImageNet and its four shifts under one budget (a 50-class ImageNet, 3
    shots: one batch of ImageNet's 128): each method's table, and the comparison a row per
    target and method with the shifted average and the differences per target."""
    import csv

    from vacsr.methods.registry import METHODS
    from vacsr.sweep.cli import main

    methods = [name for name, m in METHODS.items() if "classification" in m.tasks]

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = main(DG, ["--storage", str(tmp_path / "dg"), "--tracking-uri", uri, "--pretrained",
                     str(weights), "--methods", "all", "--seeds", "1,2", "--trials", "1",
                     "--epochs", "1", "--shots", "3",
                     "--data-root", str(_small_imagenet(tmp_path / "data"))])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    report = tmp_path / "dg" / "domain_generalization" / "report"
    table = (report / "methods" / "vacsr" / "results.md").read_text()
    for shift in ("imagenetv2_acc", "imagenet_sketch_acc", "imagenet_a_acc", "imagenet_r_acc",
                  "ood_avg_acc"):
        assert shift in table, shift
    targets = ["imagenet", "imagenetv2", "imagenet_sketch", "imagenet_a", "imagenet_r"]
    rows = list(csv.DictReader((report / "comparison.csv").open()))
    assert [(r["target"], r["method"]) for r in rows] == [
        (t, m) for t in [*targets, "shifted average"] for m in methods]
    assert all(r["accuracy"] and not r.get("failed") for r in rows)
    differences = list(csv.DictReader((report / "comparison_differences.csv").open()))
    assert [(d["target"], d["comparison"]) for d in differences] == [
        (t, c) for t in [*targets, "shifted average"] for c in (
            "the best other method on the shifted average", "the zero-shot baseline")]
    assert all(d["available"] == "True" for d in differences), differences
    assert {d["pairs"] for d in differences} == {"2", "8"}  # 2 seeds; 4 shifts x 2 seeds
    assert "| shifted average (4 target(s)) | vacsr |" in (report / "comparison.md").read_text()

    runs = _runs(uri, "vacsr-domain_generalization")
    assert runs["tags.vacsr.method"].notna().all()  # every run names its method
    cells = {(r["target"], r["method"]): r for r in rows}
    for method in methods:
        unit = runs[runs["tags.vacsr.dataset"] == f"imagenet.{method}"].iloc[0]
        assert unit["tags.vacsr.method"] == method
        shifts = [unit[f"metrics.test_seed/{s}_acc"] for s in targets[1:]]  # seed 2's, exact
        assert all(0 <= a <= 100 for a in shifts)
        assert unit["metrics.test_seed/ood_avg_acc"] == pytest.approx(sum(shifts) / 4)
        # the comparison's shifted average is the unit's table row: ood_avg_acc over seeds
        assert unit["metrics.table/ood_avg_acc"] == pytest.approx(
            float(cells[("shifted average", method)]["accuracy"]), abs=0.01)
    assert not [c for c in runs.columns if c.startswith("metrics.best_test")]  # one name each
    view = _compared_from_store(uri, "vacsr-domain_generalization", report, capsys)
    # a row per method's run, its targets and their shifted average as columns
    assert {"metrics.`table/imagenet_r_acc`", "metrics.`table/ood_avg_acc`"} <= set(view)


def _compared_from_store(uri: str, experiment: str, report, capsys) -> list[str]:
    """`vacsr best --compare` prints comparison.md again from the store alone; the sweep saved
    the comparison's MLflow view, a row per unit's run: returns its columns."""
    import csv
    import json

    from mlflow import MlflowClient

    from vacsr.cli import main as vacsr_main

    capsys.readouterr()  # the sweep's output
    assert vacsr_main(["best", "--tracking-uri", uri, "--experiment", experiment,
                       "--compare"]) == 0
    assert capsys.readouterr().out == (report / "comparison.md").read_text()
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    sweep = experiment.removeprefix("vacsr-")
    state = json.loads(json.loads(found.tags[
        f"mlflow.sharedViewState.vacsr_comparison-{sweep}"])["state"])
    shown = client.search_runs([found.experiment_id], state["searchFilter"])
    methods = {row["method"] for row in csv.DictReader((report / "comparison.csv").open())}
    assert {r.data.tags["vacsr.method"] for r in shown} == methods  # every method has its rows
    return state["selectedColumns"]
