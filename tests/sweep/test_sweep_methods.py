"""A base-to-novel sweep of several methods (`--methods`) end to end on a local Ray: each method a
unit per dataset with its own study, trials and final runs under one budget, zero-shot CLIP one
evaluation, every run naming its method, each method's table and the comparison report, the
comparison's MLflow view and `vacsr best --compare` (the report again, from the store alone), and
a selection `vacsr best --export` hands to `vacsr train --config` that trains to the same test
accuracy.

Its records are on a real PostgreSQL server (tests/support/postgres.py), both the MLflow store
(the tracking URI straight to the database) and the Optuna studies, their URLs written as users
write them (`postgresql://user:password@host:port/db`, no driver named): the sweep, its
`--resume`, `vacsr best --compare` and `--export` all read and write them there, and the password
reaches the database alone (not the console, nor the sweep's folder)."""
from __future__ import annotations

import csv
import json

import pytest

from sweeps.base2novel import SWEEP as BASE2NOVEL
from tests.support.postgres import PASSWORD, USER, create_database, start_postgresql
from vacsr.records.database_url import with_driver

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(900)]

METHODS = ("vacsr", "zero_shot", "linear_probe", "coop")


def _runs(uri: str):
    import mlflow

    mlflow.set_tracking_uri(with_driver(uri))
    return mlflow.search_runs(experiment_names=["vacsr-base2novel"])


def test_a_comparison_sweep_runs_every_method_under_one_budget(tmp_path, ray_local, weights,
                                                                servers, capsys, monkeypatch):
    import optuna
    import yaml
    from mlflow import MlflowClient

    from vacsr.cli import main as vacsr_main
    from vacsr.config import load_config
    from vacsr.sweep.cli import main

    # MLflow puts a database store's artifacts under ./mlruns of the process that creates the
    # experiment (here this one): in the test's folder, not the repository
    monkeypatch.chdir(tmp_path)
    server = start_postgresql(servers)
    uri, studies = create_database(server, "mlflow"), create_database(server, "optuna")
    stores = ["--tracking-uri", uri, "--optuna-storage", studies]
    code = main(BASE2NOVEL, ["--storage", str(tmp_path), *stores,
                             "--pretrained", str(weights), "--datasets", "eurosat",
                             "--methods", ",".join(METHODS), "--trials", "2", "--seeds", "1,2",
                             "--epochs", "2", "--cpus-per-worker", "1"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert PASSWORD not in out and f"{USER}:***@127.0.0.1" in out  # the MLflow UI hint
    assert "the method comparison: http://127.0.0.1:5000/#/experiments/" in out  # beside the
    assert "viewStateShareKey=vacsr_comparison-base2novel\n" in out  # results view's link
    report = tmp_path / "base2novel" / "report"
    text = (report / "comparison.md").read_text()
    assert "1 evaluation (no training; seeds cannot change it)" in text
    assert "VACSR" in text or "vacsr" in text
    for method in METHODS:
        assert (report / "methods" / method / "results.md").is_file(), method
    rows = list(csv.DictReader((report / "comparison.csv").open()))
    cells = {(r["dataset"], r["method"]): r for r in rows}
    assert {m for d, m in cells if d == "eurosat"} == set(METHODS)

    runs = _runs(uri)
    assert runs["tags.vacsr.method"].notna().all()  # every run names its method
    sweep = runs[runs["tags.vacsr.kind"].notna()].iloc[0]  # the sweep's own: all of them
    assert sweep["tags.vacsr.method"] == sweep["params.method"] == ",".join(METHODS)
    client = MlflowClient(with_driver(uri))  # the comparison and each method's tables
    logged = {a.path for a in client.list_artifacts(sweep.run_id)}
    assert {"comparison.md", "comparison.csv", "comparison_differences.csv"} <= logged, logged
    for method in METHODS:
        assert f"methods/{method}/results.md" in {
            a.path for a in client.list_artifacts(sweep.run_id, f"methods/{method}")}, method
    units = runs[runs["tags.vacsr.dataset"].notna()]
    assert set(units["tags.vacsr.dataset"]) == {f"eurosat.{m}" for m in METHODS}
    storage = with_driver(studies)
    for method in METHODS:
        unit = units[units["tags.vacsr.dataset"] == f"eurosat.{method}"].iloc[0]
        assert unit["params.method"] == unit["tags.vacsr.method"] == method
        children = runs[runs["tags.mlflow.parentRunId"] == unit.run_id]
        assert (children["tags.vacsr.method"] == method).all()
        assert (children["params.adapter.kind"] == method).all()
        finals = children[children["tags.mlflow.runName"].str.contains("final")]
        study = optuna.load_study(study_name=f"base2novel-eurosat.{method}", storage=storage)
        if method == "zero_shot":  # nothing searched, nothing trained: one trial, one final
            assert len(study.trials) == 1 and len(finals) == 1 and len(children) == 2
        else:  # the budget: 2 trials and the two seeds for every trained method
            assert len(study.trials) == 2 and len(finals) == 2, list(children.tags)
        # the table's row of the unit is the comparison's
        base = float(cells[("eurosat", method)]["base"])
        assert unit["metrics.table/base"] == pytest.approx(base, abs=0.01)
    # the frozen methods: no block trained, and the sweep's epochs held for every trained one
    probe = runs[(runs["tags.vacsr.method"] == "linear_probe")
                 & runs["tags.mlflow.runName"].str.contains("final")]
    assert (probe["params.model.trainable_image_blocks"] == "0").all()
    assert (probe["params.train.epochs"] == "2").all()

    # a --resume of the finished comparison runs nothing and writes the same report
    before = {p.name: p.read_bytes() for p in report.glob("comparison*")}
    code = main(BASE2NOVEL, ["--storage", str(tmp_path), *stores,
                             "--pretrained", str(weights), "--datasets", "eurosat",
                             "--methods", ",".join(METHODS), "--trials", "2", "--seeds", "1,2",
                             "--epochs", "2", "--cpus-per-worker", "1", "--resume"])
    out = capsys.readouterr().out
    assert code == 0 and PASSWORD not in out, out[-3000:]
    assert [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()
            and PASSWORD.encode() in p.read_bytes()] == []  # the sweep's folder: no password
    assert {p.name: p.read_bytes() for p in report.glob("comparison*")} == before
    assert len(_runs(uri)) == len(runs)  # the average rows' runs too: continued, not doubled
    _check_comparison_view(client, sweep.run_id, rows)

    # the comparison rebuilt from the store alone, by the code that wrote comparison.md
    report.rename(tmp_path / "report-away")
    compared = tmp_path / "compared"
    assert vacsr_main(["best", "--tracking-uri", uri, "--experiment", "vacsr-base2novel",
                       "--compare", "--export", str(compared)]) == 0
    assert capsys.readouterr().out == (
        (tmp_path / "report-away" / "comparison.md").read_text()
        + f"each method's configs written to {compared.resolve()} as <dataset>.<method>.yaml "
          "(each runs with `vacsr train --config FILE`)\n")
    for method in METHODS:  # each method's chosen config, as `vacsr train --config` reads it
        assert load_config(compared / f"eurosat.{method}.yaml").adapter.kind == method

    # a selection exported from the store trains again to the seed's test accuracy
    export = tmp_path / "export"
    assert vacsr_main(["best", "--tracking-uri", uri, "--experiment", "vacsr-base2novel",
                       "--export", str(export)]) == 0
    capsys.readouterr()
    for method in ("linear_probe", "coop"):
        config_path = export / f"eurosat.{method}.yaml"
        out_dir = tmp_path / f"again-{method}"
        assert vacsr_main(["train", "--config", str(config_path), f"train.output_dir={out_dir}",
                           "train.eval_test=true", "tracking.enabled=false",
                           "train.device=cpu"]) == 0, method
        again = json.loads((out_dir / "metrics.json").read_text())["final"]["test/acc"]
        unit = units[units["tags.vacsr.dataset"] == f"eurosat.{method}"].iloc[0]
        seed = int(yaml.safe_load(config_path.read_text())["train"]["seed"])
        per_seed = runs[(runs["tags.mlflow.parentRunId"] == unit.run_id)
                        & (runs["tags.mlflow.runName"] == f"eurosat.{method}-final-seed{seed}")]
        assert again == pytest.approx(float(per_seed.iloc[0]["metrics.test/acc"]), abs=1e-6)


def _check_comparison_view(client, sweep_id: str, rows: list[dict]) -> None:
    """The comparison's saved view on the experiment, and its rows' runs holding comparison.csv's
    numbers as the report rounds them: each unit's, and each method's average (a run of its
    own)."""
    sweep = client.get_run(sweep_id)
    view = client.get_experiment(sweep.info.experiment_id).tags[
        "mlflow.sharedViewState.vacsr_comparison-base2novel"]
    state = json.loads(json.loads(view)["state"])
    assert state["selectedColumns"][:6] == [
        "tags.`vacsr.comparison_row`", "tags.`vacsr.method`", "metrics.`table/base`",
        "metrics.`table/novel`", "metrics.`table/H`", "metrics.`table/val`"], state
    assert "params.`adapter.context_tokens`" in state["selectedColumns"]  # CoOp's own key
    shown = {(r.data.tags["vacsr.comparison_row"], r.data.tags["vacsr.method"]): r
             for r in client.search_runs([sweep.info.experiment_id], state["searchFilter"])}
    assert set(shown) == {(r["dataset"] if r["dataset"] != "average" else
                           f"average ({r['datasets']} datasets)", r["method"]) for r in rows}
    for row in rows:
        label = "average (1 datasets)" if row["dataset"] == "average" else row["dataset"]
        run = shown[(label, row["method"])]
        assert (run.info.run_name == f"average.{row['method']}") == (row["dataset"] == "average")
        for title in ("base", "novel", "H"):
            assert run.data.metrics[f"table/{title}"] == round(float(row[title]), 2), title
