"""The MLflow UI as a person sees it after a sweep, rendered in headless Chromium.

The records are written by the driver's own code (`_dataset_run`, `run_dataset`) with the Ray
parts (the search, the final seed runs) replaced by stubs, so the test needs no Ray and follows the
driver's layout when it changes. MLflow 3.17's UI decides between its GenAI views and its runs
table in the browser, not from the experiment's tags, which no Python-side test can see: hence a
real browser on a real `mlflow server`.
"""
from __future__ import annotations

import copy
import html
import queue
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import sweep_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHROMIUM = shutil.which("chromium")
DATASETS = {"eurosat": {"loss.gamma": 0.37, "adapter.num_components": 3},
            "dtd": {"loss.gamma": 2.5, "adapter.num_components": 5}}

if CHROMIUM is None:
    pytest.skip("chromium is not on PATH (Debian: apt-get install -y chromium; .ci/run installs "
                "it)", allow_module_level=True)


def _sweep_records(tmp_path: Path, monkeypatch, *argv: str) -> tuple[object, str, dict[str, str]]:
    """A finished two-dataset sweep (its command line `argv` beside the datasets) in SQLite:
    (plan, parent run id, unit -> run id). Its end is run_sweep's own (`publish_sweep`)."""
    import optuna
    import torch

    from sweeps.base2novel import SWEEP
    from vacsr.config import set_value
    from vacsr.data.generate import generate_all
    from vacsr.records import TrackingCallback
    from vacsr.records.sweep_records import SweepRecords
    from vacsr.records.sweep_state import SweepState
    from vacsr.sweep.flow import driver
    from vacsr.sweep.plan.studies import study_name
    from vacsr.sweep.report.publish import publish_sweep
    from vacsr.sweep.spec.space import start_point, suggest

    weights = tmp_path / "weights.pt"  # a weights file the stubbed search never loads
    if not weights.is_file():
        torch.save({}, weights)
        generate_all(tmp_path / "data", datasets=list(DATASETS))  # the plan checks the folders
    plan = sweep_plan(SWEEP, tmp_path / "sweeps", [
        "--datasets", ",".join(DATASETS), "--data-root", str(tmp_path / "data"),
        "--pretrained", str(weights), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
        *argv])
    plan.storage.mkdir(parents=True)

    def search(plan, unit, dataset_run_id, max_concurrent, report):
        """One trial run under the unit's run, as run_trial makes it, and in the unit's Optuna
        study; its config is the best."""
        config = copy.deepcopy(plan.configs[unit])
        space = plan.spaces[unit]
        for key, value in DATASETS[plan.dataset_of(unit)].items():
            if key in space:
                set_value(config, key, value)
        study = optuna.create_study(storage=plan.optuna_storage_url, direction="maximize",
                                    study_name=study_name(plan.name, unit))
        study.enqueue_trial(start_point(space, config))
        study.optimize(lambda trial: (suggest(trial, space), 0.5)[1], n_trials=1)
        config.train.output_dir = str(tmp_path / "trials" / unit / "trial_00000")
        trial = TrackingCallback.start(config, experiment=plan.kind.experiment,
                                       run_name=f"{unit}-trial_00000",
                                       tracking_uri=plan.tracking_uri,
                                       parent_run_id=dataset_run_id, resume=False).tracker()
        trial.log_epoch(1, {"val/acc": 0.5, "train/loss": 1.2})
        trial.finish()
        return {"config": config, "val": 0.5, "num_trials": 1, "failed_trials": 0}

    def finals(plan, unit, best, dataset_run_id, report):
        # each unit's values its own
        shift = (list(DATASETS).index(plan.dataset_of(unit)) / 10
                 + plan.methods.index(plan.method_of(unit)) / 20)
        return {"per_seed": [{"seed": s, "acc": 0.6 + s / 100 + shift, "novel_acc": 0.4 + shift}
                             for s in plan.seeds_of(unit)],
                "reused_trial": None}

    # where run_dataset imports them from as it runs
    monkeypatch.setattr("vacsr.sweep.search.tune.search_dataset", search)
    monkeypatch.setattr("vacsr.sweep.final.seeds.final_runs", finals)
    # leaves os.environ alone
    monkeypatch.setattr("vacsr.sweep.flow.dataset_task.quiet_logging", lambda verbose: None)

    state = SweepState(plan.storage / "sweep_state.json", fresh=True)
    parent = SweepRecords(plan.tracking_uri, plan.kind.experiment).start_sweep_run(
        state, plan.name, plan.kind.name, plan.methods)
    runs = {}
    for unit in plan.datasets:
        runs[unit] = driver._dataset_run(plan, state, unit, parent.run_id)
        result = driver.run_dataset(plan, unit, runs[unit], 1, queue.Queue())
        state.update(unit, done=True, result=result)  # as _finish_dataset records it
    publish_sweep(plan, state, parent, {})  # as run_sweep ends
    parent_id = parent.run_id
    parent.finish()
    return plan, parent_id, runs


def _render(url: str, profile: Path, width: int = 3000) -> str:
    """The DOM after the page's scripts ran. A fresh profile: no workflow type remembered in
    localStorage, as for someone opening the UI for the first time."""
    out = subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={profile}", "--virtual-time-budget=20000",
         # the grid renders only the columns inside the window: a wide screen shows them all
         f"--window-size={width},1000", "--dump-dom", url],
        capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and out.stdout, f"chromium failed on {url}: {out.stderr[-2000:]}"
    return out.stdout


def _text(dom: str) -> str:
    """The page's visible text on one line."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


def _cell(row: str, kind: str, key: str, shown: str) -> bool:
    """Whether the row's cell of column `kind`.`key` (metrics, params, tags) shows `shown`."""
    return re.search(rf'col-id="{kind}\.`{re.escape(key)}`" aria-describedby="cell-[^"]*"'
                     rf'[^>]*>(?:<[^>]+>|\s)*{re.escape(shown)}\s*<', row) is not None


def _row(dom: str, run_id: str) -> str:
    """The runs grid's cells of one run (its row-id is the run id), every container's part."""
    return " ".join(re.findall(rf'row-id="{run_id}".*?(?=role="row"|$)', dom, flags=re.S))


def _title(dom: str) -> str:
    match = re.search(r"<title>([^<]*)</title>", dom)
    return html.unescape(match.group(1)) if match else ""


def test_ui_opens_on_runs_and_shows_selected_params(tmp_path, monkeypatch, servers):
    """A sweep's results view, a dataset run's page, and a sweep of several methods' comparison
    view, on one server."""
    from vacsr.records import MlflowTracker
    from vacsr.sweep.flow.driver import mlflow_ui_hint

    plan, parent_id, runs = _sweep_records(tmp_path, monkeypatch)
    base, _ = servers.mlflow(plan.tracking_uri, timeout=120)
    experiment_id = MlflowTracker(plan.tracking_uri).experiment_id(plan.kind.experiment)

    # (a) the link the sweep prints, on this server's port
    hint = mlflow_ui_hint(plan.tracking_uri, experiment_id, plan.name)
    link = re.search(r"http://127\.0\.0\.1:5000(/\S*)", hint)
    assert link, hint
    dom = _render(base + link.group(1), tmp_path / "chrome-runs")
    text = _text(dom)
    assert _title(dom).startswith(f"Runs - Experiment {experiment_id}"), (_title(dom), text[:1500])
    assert "Run Name" in text, text[:1500]  # the runs table's header
    for name, run_id in {plan.name: parent_id, **runs}.items():
        row = re.search(rf'href="#/experiments/{experiment_id}/runs/{run_id}"[^>]*>'
                        rf'(?:<[^>]+>)*{re.escape(name)}<', dom)
        assert row, f"run {name} ({run_id}) not listed in the runs table: {text[:1500]}"
    assert "trial_00000" not in text  # trials stay out of the sweep's list
    assert "base2novel: results" in text  # the sweep's saved view is the one open
    # the final table's metrics are columns, without clicking: H of each dataset in its row
    client = MlflowTracker(plan.tracking_uri).client
    report = (plan.storage / "report" / "results.md").read_text()
    for name, run_id in runs.items():
        metrics = client.get_run(run_id).data.metrics
        row = _row(dom, run_id)
        for key in ("table/base", "table/novel", "table/H", "table/val"):
            assert metrics[key] == round(metrics[key], 2), (key, metrics[key])  # as the table
            assert _cell(row, "metrics", key, repr(metrics[key])), \
                f"{key} = {metrics[key]} of {name} not shown: {_text(row)}"
        assert re.search(rf"^\| {name} \| .* \| {metrics['table/H']:.2f}( ± \S+)? \| ", report,
                         flags=re.M), report  # the number results.md shows
        # the chosen config's searched keys are columns too, rounded as read
        for key, value in DATASETS[name].items():
            assert _cell(row, "params", key, str(value)), f"{key} of {name}: {_text(row)}"
        assert metrics["table/H_std"] == round(metrics["table/H_std"], 2)  # two seeds: spread
        assert _cell(row, "tags", "vacsr.table_row", name)
        digest = client.get_run(run_id).inputs.dataset_inputs[0].dataset.digest
        assert f"{name} ({digest})" in text  # the Dataset column: the run's dataset input
    # the sweep's own run is the average row, and says so
    assert _cell(_row(dom, parent_id), "tags", "vacsr.table_row", "average (2 datasets)"), \
        _text(_row(dom, parent_id))

    # (b) a dataset run's page, through the link in that table
    dom = _render(f"{base}/#/experiments/{experiment_id}/runs/{runs['eurosat']}",
                  tmp_path / "chrome-run")
    text = _text(dom)
    assert _title(dom).startswith(f"Run {runs['eurosat']}"), (_title(dom), text[:1500])
    params = re.search(r"Parameters \((\d+)\) Parameter Value (.*?) About this run", text)
    assert params, text[:3000]
    assert int(params.group(1)) == len(plan.spaces["eurosat"])  # the searched keys, no more
    for key, value in DATASETS["eurosat"].items():  # the selected value in the key's row
        assert re.search(rf"(?:^| ){re.escape(key)} {re.escape(str(value))}(?: |$)",
                         params.group(2)), params.group(2)
    assert "test_seed/acc" in text and "best_test_acc" not in text, text[:3000]

    _check_comparison_view(tmp_path, monkeypatch, base)


def _check_comparison_view(tmp_path: Path, monkeypatch, base: str) -> None:
    """(c) A sweep of several methods in the same store: its second link opens the method
    comparison, a row per dataset x method and one per method's average, with the comparison's
    numbers, each unit's chosen values, and no other run."""
    import csv
    import json

    from vacsr.records import MlflowTracker
    from vacsr.sweep.flow.driver import comparison_hint

    methods = ("vacsr", "coop")
    plan, parent_id, runs = _sweep_records(tmp_path, monkeypatch, "--methods", ",".join(methods),
                                           "--name", "cmp", "--seeds", "1,2")
    experiment_id = MlflowTracker(plan.tracking_uri).experiment_id(plan.kind.experiment)
    hint = comparison_hint(plan.tracking_uri, experiment_id, plan.name)
    link = re.search(r"http://127\.0\.0\.1:5000(/\S*)", hint or "")
    assert link, hint
    # wider: every method's searched keys are columns
    dom = _render(base + link.group(1), tmp_path / "chrome-comparison", width=5000)
    text = _text(dom)
    assert _title(dom).startswith(f"Runs - Experiment {experiment_id}"), (_title(dom), text[:1500])
    assert "cmp: method comparison" in text, text[:1500]  # the comparison's view is open
    client = MlflowTracker(plan.tracking_uri).client
    rows = {(r["dataset"], r["method"]): r for r in csv.DictReader(
        (plan.storage / "report" / "comparison.csv").open())}
    averages = json.loads((plan.storage / "sweep_state.json").read_text())["averages"]
    shown = {**{(plan.dataset_of(u), plan.method_of(u)): run_id for u, run_id in runs.items()},
             **{("average", m): averages[m]["run_id"] for m in methods}}
    assert len(shown) == 2 * len(methods) + len(methods)
    # its rows alone: not the sweep's own run, its trials, nor the other sweep's runs
    assert set(re.findall(r'row-id="([0-9a-f]{32})"', dom)) == set(shown.values()), text[:1500]
    assert parent_id not in shown.values()
    for (dataset, method), run_id in shown.items():
        row, expected = _row(dom, run_id), rows[(dataset, method)]
        label = dataset if dataset != "average" else f"average ({expected['datasets']} datasets)"
        assert _cell(row, "tags", "vacsr.comparison_row", label), (dataset, method, _text(row))
        assert _cell(row, "tags", "vacsr.method", method), (dataset, method, _text(row))
        for title in ("base", "novel", "H"):  # the comparison's numbers, as the report rounds
            value = round(float(expected[title]), 2)
            assert _cell(row, "metrics", f"table/{title}", repr(value)), \
                (dataset, method, title, value, _text(row))
        if dataset != "average":  # each unit's chosen values, among the searched keys
            params, space = client.get_run(run_id).data.params, plan.spaces[f"{dataset}.{method}"]
            # a key drawn under a condition (CoOp's count, under a random init) is among the
            # chosen values only where the chosen config drew it
            assert all(key in params for key, domain in space.items() if domain.when is None)
            for key in (key for key in space if key in params):
                assert _cell(row, "params", key, params[key]), (key, _text(row))
