"""vacsr/records owns a sweep's records: MLflow is opened there alone, sweep_state.json carries
its record format (a folder of an older vacsr is refused in one line), and the saved view is
written only on MLflow releases whose UI format it knows."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, make_dataset_folders, one_line
from sweeps.base2novel import SWEEP as BASE2NOVEL

PACKAGE = REPO / "vacsr"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _source_hits(pattern: str) -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)}:{number}"
            for path in sorted(PACKAGE.rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if re.search(pattern, line)]


def test_only_records_opens_mlflow():
    """Trackers and clients are made in one module; the sweep reaches MLflow through records
    (the sweep scripts check that mlflow is installed with find_spec, importing nothing)."""
    made = {hit.split(":")[0] for hit in _source_hits(r"MlflowTracker\(|MlflowClient\(")}
    assert made == {"vacsr/records/tracker.py"}
    imports = [hit for hit in _source_hits(r"^\s*(import mlflow|from mlflow)")
               if not hit.startswith("vacsr/records/")]
    assert imports == []
    assert [hit for hit in _source_hits(r"\.client\b")
            if not hit.startswith("vacsr/records/")] == []  # nor its raw client


def test_the_state_carries_its_record_format(tmp_path):
    from vacsr.errors import ConfigError
    from vacsr.records.sweep_state import FORMAT, SweepState

    path = tmp_path / "sweep_state.json"
    SweepState(path, fresh=True).update(settings={})
    assert json.loads(path.read_text())["format"] == FORMAT
    SweepState(path, fresh=False).check_format()
    path.write_text('{"datasets": {}}')
    with pytest.raises(ConfigError, match="written by an older vacsr"):
        SweepState(path, fresh=False).check_format()


@pytest.mark.parametrize("recorded,fragment", [
    (None, "written by an older vacsr (before record format 3)"),
    (2, "record format 2, this vacsr resumes format 3"),
])
def test_a_resume_of_a_sweep_of_another_record_format_is_refused_in_one_line(
        tmp_path, capsys, recorded, fragment):
    """The sweep folder of an older vacsr: its Tune and Optuna pickles name modules this vacsr
    does not have (vacsr.sweep.searcher, ...). --resume stops before Ray starts, in one line,
    and leaves every file of the folder as it was."""
    import ray

    from vacsr.sweep import cli

    data = make_dataset_folders(tmp_path / "data")
    root = tmp_path / "store" / "base2novel"
    (root / "tune" / "eurosat").mkdir(parents=True)
    state = {"datasets": {"eurosat": {"run_id": "0" * 32, "run_key": "a" * 32}},
             "parent_run_id": "1" * 32, "parent_run_key": "b" * 32, "settings": {}}
    if recorded is not None:
        state["format"] = recorded
    (root / "sweep_state.json").write_text(json.dumps(state))
    (root / "tune" / "eurosat" / "searcher-state-2026-01-01.pkl").write_bytes(
        b"\x80\x04\x95\x00cvacsr.sweep.searcher\nOptunaStudySearch\n")
    before = _files(tmp_path)
    line = one_line(["--datasets", "eurosat", "--data-root", data, "--storage",
                     tmp_path / "store", "--resume"], capsys,
                    entry=lambda argv: cli.main(BASE2NOVEL, argv))
    assert line == (f"vacsr: error: {root / 'sweep_state.json'}: {fragment}; finish that sweep "
                    "with the vacsr that started it, or start a new sweep with another --name")
    assert _files(tmp_path) == before
    assert not ray.is_initialized()


def _published(tmp_path: Path, capsys):
    """A sweep's run and one dataset run; publish_table as the sweep ends, what it printed on
    stderr. Returns (tracker of the sweep's run, dataset run id, store URI, stderr lines)."""
    from vacsr.records import MlflowTracker
    from vacsr.records.view import publish_table

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    plan = SimpleNamespace(kind=BASE2NOVEL, name="s1", datasets=["eurosat"],
                           spaces={"eurosat": {"loss.gamma": None, "adapter.num_components": None}})
    parent = MlflowTracker(uri)
    parent.start(BASE2NOVEL.experiment, "s1", tags={"vacsr.sweep": "s1"})
    child = MlflowTracker(uri)
    run_id = child.start(BASE2NOVEL.experiment, "eurosat", parent_run_id=parent.run_id)
    child.finish()
    capsys.readouterr()  # MLflow's own lines as it creates the store
    rows = [{"dataset": "eurosat", "seeds": 1, "base": 70.0, "base_std": 0.0, "novel": 60.0,
             "novel_std": 0.0, "H": 64.615384, "H_std": 0.0, "val": 71.234}]
    publish_table(parent, plan, rows, {"eurosat": run_id})
    return parent, run_id, uri, capsys.readouterr().err.splitlines()


def test_the_view_is_skipped_on_an_mlflow_whose_view_format_is_unknown(tmp_path, capsys,
                                                                       monkeypatch):
    import mlflow

    from vacsr.records.view import VIEW_TAG_PREFIX
    from vacsr.sweep.flow.driver import mlflow_ui_hint

    monkeypatch.setattr(mlflow, "__version__", "3.99.1")
    parent, run_id, uri, err = _published(tmp_path, capsys)
    assert len(err) == 1 and err[0].startswith("vacsr: note: MLflow 3.99 is not a release"), err
    experiment_id = parent.experiment_id(BASE2NOVEL.experiment)
    tags = parent.client.get_experiment(experiment_id).tags
    assert not [t for t in tags if t.startswith(VIEW_TAG_PREFIX)]
    metrics = parent.client.get_run(run_id).data.metrics  # still there, rounded as the table
    assert metrics == {"table/base": 70.0, "table/novel": 60.0, "table/H": 64.62,
                       "table/val": 71.23}  # one seed: no spread
    assert parent.client.get_run(run_id).data.tags["vacsr.table_row"] == "eurosat"
    link = mlflow_ui_hint(uri, experiment_id, "s1")
    assert "searchFilter=" in link and "viewStateShareKey" not in link

    monkeypatch.undo()  # the installed MLflow: the view is saved, and the link opens it
    parent, run_id, uri, err = _published(tmp_path, capsys)
    assert err == []
    tags = parent.client.get_experiment(experiment_id).tags
    assert [t for t in tags if t.startswith(VIEW_TAG_PREFIX)] == [f"{VIEW_TAG_PREFIX}vacsr-s1"]
    state = json.loads(json.loads(tags[f"{VIEW_TAG_PREFIX}vacsr-s1"])["state"])
    assert state["selectedColumns"] == [
        "tags.`vacsr.table_row`", "metrics.`table/base`", "metrics.`table/novel`",
        "metrics.`table/H`", "metrics.`table/val`", "params.`loss.gamma`",
        "params.`adapter.num_components`", "attributes.`Dataset`"]
    hint = mlflow_ui_hint(uri, experiment_id, "s1")
    assert "viewStateShareKey=vacsr-s1" in hint
    # the printed command runs as printed (no activated venv needed): its --help answers
    command = shlex.split(hint.split("   # ")[0])
    assert command[:4] == [sys.executable, "-m", "mlflow", "ui"], command
    shown = subprocess.run(command[:4] + ["--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "--backend-store-uri" in shown.stdout, shown.stderr[-2000:]


def test_reading_a_run_artifact_leaves_no_temporary_copy(tmp_path, monkeypatch):
    """MLflow downloads an artifact into a new temporary folder of its own unless told where:
    `vacsr best` and the sweep's report left a best_config.yaml in /tmp per dataset read."""
    import tempfile

    from vacsr.records import MlflowTracker
    from vacsr.records.sweep_records import SweepRecords

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri)
    run_id = tracker.start(BASE2NOVEL.experiment, "eurosat")
    (tmp_path / "best_config.yaml").write_text("train:\n  epochs: 3\n")
    tracker.log_artifact(tmp_path / "best_config.yaml")
    tracker.log_json("final_runs.json", {"reused_trial": None})
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    records = SweepRecords(uri, BASE2NOVEL.experiment)
    assert records.artifact(run_id, "best_config.yaml") == b"train:\n  epochs: 3\n"
    assert records.artifact_json(run_id, "final_runs.json") == {"reused_trial": None}
    assert list(temporary.iterdir()) == []


def test_a_resume_continues_the_average_runs_and_clears_a_failure(tmp_path):
    """The comparison's average rows are runs sweep_state.json records (`averages`): a resumed
    sweep continues them, never opens a second one. A dataset run's failure reason stays on it
    until the resume starts it again."""
    from vacsr.records.sweep_records import FAILED_TAG, SweepRecords
    from vacsr.records.sweep_state import SweepState

    uri, path = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "sweep_state.json"
    records = SweepRecords(uri, BASE2NOVEL.experiment)
    state = SweepState(path, fresh=True)
    parent = records.start_sweep_run(state, "s1", "base2novel", ("vacsr", "coop"))
    run_id = records.start_dataset_run(state, "eurosat.coop", "s1", parent.run_id, "coop")
    records.note_failure(run_id, "coop diverged")
    state.update("eurosat.coop", failed="coop diverged")
    records.close_dataset_run(run_id, "FAILED")
    average = records.start_average_run(state, "vacsr", "s1", parent.run_id)
    first = average.run_id
    average.finish()
    assert records.store.client.get_run(run_id).data.tags[FAILED_TAG] == "coop diverged"

    resumed = SweepState(path, fresh=False)  # what --resume reads
    assert records.start_dataset_run(resumed, "eurosat.coop", "s1", parent.run_id,
                                     "coop") == run_id
    assert FAILED_TAG not in records.store.client.get_run(run_id).data.tags
    again = records.start_average_run(resumed, "vacsr", "s1", parent.run_id)
    assert again.run_id == first
    assert [r.info.run_id for r in records.child_runs(parent.run_id)
            if r.info.run_name == "average.vacsr"] == [first]
    assert resumed.entry("vacsr", "averages")["run_id"] == first
