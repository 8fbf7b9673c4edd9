"""MLflow tracking against a real SQLite store in a tmp folder (no server, no network)."""
from __future__ import annotations

import json
import logging
import pickle
import shutil
from functools import partial

import pytest

with pytest.MonkeyPatch.context() as _env:  # no telemetry thread calling out from the tests
    _env.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402

from vacsr.config import flatten, load_config, to_dict  # noqa: E402
from vacsr.errors import ConfigError  # noqa: E402
from vacsr.records import (  # noqa: E402
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    PARAMS_CHANGED_TAG,
    RUN_STATE_FILE,
    MlflowTracker,
    TrackingCallback,
    check_tracking_uri,
    metric_name,
    resolve_tracking_uri,
)


@pytest.fixture(scope="module")
def template_db(tmp_path_factory):
    """An empty, migrated MLflow database: creating one takes ~10 s, copying it is instant."""
    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def tracking_uri(template_db, tmp_path, monkeypatch):
    """A fresh store per test, set as env and fluent URI; both restored afterwards."""
    folder = tmp_path / "tracking"
    folder.mkdir()
    shutil.copy(template_db, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri(None)  # also unsets the env var; monkeypatch then restores it


def _steps(client, run_id, key):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def test_training_run_logs_params_epochs_and_artifacts(tracking_uri, tmp_path):
    from vacsr.train.loop import Trainer

    cfg = load_config(overrides=[f"train.output_dir={tmp_path / 'run'}", "train.epochs=2",
                                 "train.batch_size=16", "train.progress=false", "data.num_train=16",
                                 "data.num_test=8", "adapter.hidden_dim=16"])
    driver_side = TrackingCallback.start(cfg, experiment="vacsr-test", metric="val/rsum")
    worker_side = pickle.loads(pickle.dumps(driver_side))  # as Ray ships it to a worker
    result = Trainer(cfg).fit(callbacks=(worker_side,))
    driver_side.finish(result, cfg.train.output_dir)

    runs = mlflow.search_runs(experiment_names=["vacsr-test"])
    assert len(runs) == 1
    run = runs.iloc[0]
    assert run["status"] == "FINISHED" and run["run_id"] == driver_side.run_id
    params = {c[len("params."):]: run[c] for c in runs.columns if c.startswith("params.")}
    assert params == {k: str(v) for k, v in flatten(cfg).items()}
    # Artifacts live next to the database, not under the working directory.
    assert run["artifact_uri"].startswith((tmp_path / "tracking" / "mlartifacts").as_uri())

    client = MlflowClient()
    history = result.history
    assert [h["epoch"] for h in history] == [1, 2]
    for key in ("train/loss", "train/kl", "val/rsum", "val/i2t_r1"):
        steps, values = zip(*_steps(client, run["run_id"], key))
        assert steps == (1, 2), key
        assert values == pytest.approx([h[key] for h in history]), key
    best = max(h["val/rsum"] for h in history)
    assert run["metrics.best_val/rsum"] == pytest.approx(best)

    top = {a.path for a in client.list_artifacts(run["run_id"])}
    assert {"config.yaml", "metrics.json", "plots"} <= top
    assert [a.path for a in client.list_artifacts(run["run_id"], "plots")] == [
        "plots/training_curves.png"]
    local = client.download_artifacts(run["run_id"], "", str(tmp_path / "download"))
    assert json.loads((tmp_path / "download" / "metrics.json").read_text())["history"] == \
        json.loads((tmp_path / "run" / "metrics.json").read_text())["history"]
    assert to_dict(load_config(f"{local}/config.yaml")) == to_dict(cfg)
    png = (tmp_path / "download" / "plots" / "training_curves.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000


def test_the_run_lifecycle_opens_its_mlflow_run_from_the_config(tracking_uri, tmp_path):
    """Trainer.fit opens the MLflow run its caller hands it the opener of (local runs, Ray Train
    workers and the sweeps' runs share that lifecycle); a restart resumes the same MLflow run."""
    from vacsr.train.loop import Trainer

    overrides = [f"train.output_dir={tmp_path / 'run'}", "train.epochs=1", "train.batch_size=16",
                 "train.progress=false", "data.num_train=16", "data.num_test=8",
                 "adapter.hidden_dim=16", "tracking.enabled=true", "tracking.experiment=lifecycle",
                 "tracking.run_name=r1"]
    for config in (load_config(overrides=overrides),
                   load_config(overrides=overrides + ["train.epochs=2", "train.resume=true"])):
        Trainer(config).fit(open_logger=partial(TrackingCallback.from_config, config))
    runs = mlflow.search_runs(experiment_names=["lifecycle"])
    assert list(runs["status"]) == ["FINISHED"] and list(runs["tags.mlflow.runName"]) == ["r1"]
    steps = _steps(MlflowClient(), runs.run_id[0], "train/loss")
    assert [step for step, _ in steps] == [1, 2]  # the resumed epoch joined the first run


def test_a_run_ended_by_system_exit_is_killed_and_one_that_raised_failed(tracking_uri, tmp_path):
    """Tune ends a trial ASHA stopped with SystemExit inside tune.report (the trial's thread):
    its MLflow run is a stopped run, KILLED, as after Ctrl-C, not FAILED as after an error."""
    from vacsr.train.loop import Trainer
    from vacsr.train.run_hooks import RunHooks

    class EndsAfterFirstEpoch(RunHooks):
        def __init__(self, error: BaseException) -> None:
            self.error = error

        def after_logging(self, trainer, epoch, metrics):
            raise self.error

    for name, error in (("stopped", SystemExit(0)), ("broken", RuntimeError("bug"))):
        overrides = [f"train.output_dir={tmp_path / name}", "train.epochs=2",
                     "train.batch_size=16", "train.progress=false", "data.num_train=16",
                     "data.num_test=8", "adapter.hidden_dim=16", "tracking.enabled=true",
                     "tracking.experiment=ends", f"tracking.run_name={name}"]
        config = load_config(overrides=overrides)
        with pytest.raises(type(error)):
            Trainer(config).fit(EndsAfterFirstEpoch(error),
                                open_logger=partial(TrackingCallback.from_config, config))
    runs = mlflow.search_runs(experiment_names=["ends"])
    status = dict(zip(runs["tags.mlflow.runName"], runs["status"]))
    assert status == {"stopped": "KILLED", "broken": "FAILED"}
    stopped = runs[runs["tags.mlflow.runName"] == "stopped"].run_id.iloc[0]
    assert [step for step, _ in _steps(MlflowClient(), stopped, "train/loss")] == [1]


def test_parent_and_child_runs_found_by_parent_tag(tracking_uri):
    with MlflowTracker() as sweep:
        sweep_id = sweep.start("sweep-retrieval", "sweep")
        dataset_ids = []
        for dataset in ("coco", "f30k"):
            with MlflowTracker() as child:
                dataset_ids.append(child.start("sweep-retrieval", dataset,
                                               parent_run_id=sweep_id))
        with pytest.raises(ZeroDivisionError), MlflowTracker() as trial:
            trial_id = trial.start("sweep-retrieval", "trial-0", parent_run_id=dataset_ids[0])
            1 / 0

    def children(parent):
        found = mlflow.search_runs(experiment_names=["sweep-retrieval"],
                                   filter_string=f"tags.mlflow.parentRunId = '{parent}'")
        return dict(zip(found["run_id"], found["status"]))

    assert children(sweep_id) == {dataset_ids[0]: "FINISHED", dataset_ids[1]: "FINISHED"}
    assert children(dataset_ids[0]) == {trial_id: "FAILED"}
    assert MlflowClient().get_run(sweep_id).info.status == "FINISHED"


def test_sync_history_after_resume_neither_loses_nor_repeats_an_epoch(tracking_uri):
    history = [{"epoch": e, "train/loss": 1.0 / e, "test/rsum": 10.0 * e, "note": "x"}
               for e in (1, 2, 3, 4)]
    first = MlflowTracker()
    run_id = first.start("resume", "run")
    for entry in history[:2]:
        first.log_epoch(entry["epoch"], entry)
    # Crash after epoch 3's checkpoint, with only part of its metrics logged.
    first.log_epoch(3, {"train/loss": history[2]["train/loss"]})
    del first

    resumed = MlflowTracker()
    resumed.resume(run_id)
    assert resumed.sync_history(history[:3]) == [3]  # only the missing test/rsum of epoch 3
    assert resumed.log_epoch(4, history[3]) == 2
    assert resumed.sync_history(history) == []  # everything is there: nothing logged twice
    assert resumed.log_epoch(3, history[2]) == 0
    resumed.finish()

    client = MlflowClient()
    for key in ("train/loss", "test/rsum"):
        assert _steps(client, run_id, key) == [(h["epoch"], h[key]) for h in history], key
    assert set(client.get_run(run_id).data.metrics) == {"train/loss", "test/rsum"}


def test_metric_names_are_sanitised_and_non_numbers_dropped(tracking_uri):
    with MlflowTracker() as tracker:
        run_id = tracker.start("names", "run")
        tracker.log_epoch(1, {"val/R@1 (%)": 50, "/../odd//key/": 1.5, "flag": True, "s": "x"})
    metrics = MlflowClient().get_run(run_id).data.metrics
    assert metrics == {"val/R_1 ___": 50.0, "__/odd/key": 1.5}
    assert metric_name("a:b") == "a_b"


def test_tracking_uri_from_env_and_relative_paths_become_absolute(tracking_uri, tmp_path,
                                                                   monkeypatch):
    assert resolve_tracking_uri() == tracking_uri
    with MlflowTracker() as tracker:  # no URI given: the env var's store is used
        run_id = tracker.start("env", "run")
    assert MlflowClient(tracking_uri=tracking_uri).get_run(run_id).info.status == "FINISHED"

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///rel/mlflow.db")
    assert resolve_tracking_uri() == f"sqlite:///{tmp_path}/rel/mlflow.db"
    assert resolve_tracking_uri("store") == f"sqlite:///{tmp_path}/store/mlflow.db"
    assert resolve_tracking_uri("file:./mlruns") == (tmp_path / "mlruns").as_uri()
    assert resolve_tracking_uri("http://host:5000") == "http://host:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert resolve_tracking_uri(default_dir="out") == f"sqlite:///{tmp_path}/out/mlflow.db"


def test_resumed_training_continues_the_same_run(tracking_uri, tmp_path):
    cfg = load_config(overrides=[f"train.output_dir={tmp_path / 'run'}"])
    first = TrackingCallback.start(cfg, experiment="resume-cb")
    first(0, {"epoch": 1, "train/loss": 2.0}, tmp_path / "run" / "last.ckpt")
    assert json.loads((tmp_path / "run" / RUN_STATE_FILE).read_text())["run_id"] == first.run_id
    assert not list((tmp_path / "run").glob(f".{RUN_STATE_FILE}*"))  # no temporary file left

    again = TrackingCallback.start(cfg, experiment="resume-cb")
    assert again.run_id == first.run_id
    changed = TrackingCallback.start(load_config(overrides=[
        f"train.output_dir={tmp_path / 'run'}", "loss.beta=2.0"]), experiment="resume-cb")
    run = MlflowClient().get_run(first.run_id)
    assert changed.run_id == first.run_id and run.data.params["loss.beta"] == "1.0"
    assert run.data.tags["vacsr.params_changed_on_resume"] == "loss.beta"
    fresh = TrackingCallback.start(load_config(overrides=[
        f"train.output_dir={tmp_path / 'run'}", "train.resume=false"]), experiment="resume-cb")
    assert fresh.run_id != first.run_id


def test_unreachable_tracking_uris_raise_config_error_naming_them(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, so no folder can be made under it")
    not_a_db = tmp_path / "junk.db"
    not_a_db.write_bytes(b"not sqlite " * 100)
    for uri in ("http://127.0.0.1:9", f"sqlite:///{blocker}/sub/mlflow.db",
                f"sqlite:///{not_a_db}", "ftp://example.invalid/x"):
        with pytest.raises(ConfigError) as info:
            check_tracking_uri(uri, timeout_s=1.0)
        assert uri in str(info.value) and "\n" not in str(info.value)

    good = tmp_path / "new" / "folder" / "mlflow.db"
    check_tracking_uri(f"sqlite:///{good}")  # creates the folder SQLite needs
    assert good.parent.is_dir() and not good.exists()


def test_experiments_are_tagged_as_model_training(tracking_uri):
    client = MlflowClient()
    with MlflowTracker() as tracker:
        tracker.start("kind-new", "run")
    assert client.get_experiment_by_name("kind-new").tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert (EXPERIMENT_KIND_TAG, EXPERIMENT_KIND) == ("mlflow.experimentKind",
                                                      "custom_model_development")

    untagged = client.create_experiment("kind-old")  # made before the tag existed
    chosen = client.create_experiment("kind-chosen", tags={EXPERIMENT_KIND_TAG: "finetuning"})
    tracker = MlflowTracker()
    assert tracker.experiment_id("kind-old") == untagged
    assert tracker.experiment_id("kind-chosen") == chosen
    reread = MlflowClient(tracking_uri=tracking_uri)  # from the SQLite file, not a cache
    assert reread.get_experiment(untagged).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert reread.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "finetuning"


def test_log_params_keeps_first_values_and_warns_on_changes(tracking_uri, caplog):
    client = MlflowClient()
    with MlflowTracker() as tracker:
        run_id = tracker.start("params", "run")
        assert tracker.log_params({"lr": 0.1, "opt/name": "adam", "bad key!": None}) == []
        assert tracker.log_params({"lr": 0.1, "epochs": 3}) == []  # equal value: skipped
        with caplog.at_level(logging.WARNING, logger="vacsr.records"):
            assert tracker.log_params({"lr": 0.2, "seed": 1}) == ["lr"]
    assert "lr" in caplog.text and run_id in caplog.text
    run = client.get_run(run_id)
    assert run.data.params == {"lr": "0.1", "opt/name": "adam", "bad key_": "None",
                               "epochs": "3", "seed": "1"}
    assert run.data.tags[PARAMS_CHANGED_TAG] == "lr"

    resumed = MlflowTracker()  # a new process: learns the run's params from the store
    resumed.resume(run_id)
    assert resumed.log_params({"epochs": 5, "seed": 1, "extra": "x"}) == ["epochs"]
    resumed.finish()
    run = client.get_run(run_id)
    assert run.data.params["epochs"] == "3" and run.data.params["extra"] == "x"
    assert run.data.tags[PARAMS_CHANGED_TAG] == "epochs"


class Killed(BaseException):
    """Stands for SIGKILL at one point of a start: nothing after it in that process runs."""


def _runs_named(experiment: str, name: str) -> list[str]:
    found = mlflow.search_runs(experiment_names=[experiment],
                               filter_string=f"tags.mlflow.runName = '{name}'")
    return list(found["run_id"])


def test_a_start_killed_before_recording_its_run_is_continued_not_doubled(tracking_uri, tmp_path,
                                                                          monkeypatch):
    """A training (a sweep's trial or final seed run) killed after MLflow created its run but
    before mlflow_run.json named it: the restart continues that run (found by its key)."""
    import vacsr.records.callback as callback_module

    cfg = load_config(overrides=[f"train.output_dir={tmp_path / 'run'}"])
    write = callback_module._write_run_state

    def killed_once_the_run_exists(output_dir, state):
        if "run_id" in state:
            raise Killed
        write(output_dir, state)

    monkeypatch.setattr(callback_module, "_write_run_state", killed_once_the_run_exists)
    with pytest.raises(Killed):
        TrackingCallback.start(cfg, experiment="killed", run_name="ds-final-seed1")
    [orphan] = _runs_named("killed", "ds-final-seed1")
    monkeypatch.setattr(callback_module, "_write_run_state", write)

    restarted = TrackingCallback.start(cfg, experiment="killed", run_name="ds-final-seed1")
    assert restarted.run_id == orphan and _runs_named("killed", "ds-final-seed1") == [orphan]
    state = json.loads((tmp_path / "run" / RUN_STATE_FILE).read_text())
    assert state["run_id"] == orphan
    # a fresh start (train.resume=false) is a new run under a new key, never the old one
    fresh = TrackingCallback.start(load_config(overrides=[
        f"train.output_dir={tmp_path / 'run'}", "train.resume=false"]),
        experiment="killed", run_name="ds-final-seed1")
    fresh_state = json.loads((tmp_path / "run" / RUN_STATE_FILE).read_text())
    assert fresh.run_id != orphan and fresh_state["run_key"] != state["run_key"]


@pytest.mark.parametrize("damage", ["{garbage", "[1, 2]", '{"run_id": 7}', "\udcff"])
def test_a_damaged_run_record_continues_the_folders_run_not_a_second(tracking_uri, tmp_path,
                                                                     damage):
    """mlflow_run.json overwritten with something that is not its record: a resume continues
    the run that trained into the folder (found by its vacsr.output_dir tag) instead of opening
    a second run of the same name beside it; a fresh start still opens a new run."""
    cfg = load_config(overrides=[f"train.output_dir={tmp_path / 'run'}"])
    first = TrackingCallback.start(cfg, experiment="damaged", run_name="ds-trial")
    (tmp_path / "run" / RUN_STATE_FILE).write_text(damage, errors="surrogateescape")
    resumed = TrackingCallback.start(cfg, experiment="damaged", run_name="ds-trial")
    assert resumed.run_id == first.run_id
    assert _runs_named("damaged", "ds-trial") == [first.run_id]
    state = json.loads((tmp_path / "run" / RUN_STATE_FILE).read_text())
    assert state["run_id"] == first.run_id  # the record is whole again


@pytest.mark.parametrize("dataset", [None, "caltech101"])
def test_a_sweep_driver_killed_before_recording_a_run_continues_it_on_resume(
        tracking_uri, tmp_path, dataset):
    """The sweep's run (dataset None) and each dataset's run: sweep_state.json holds the run's key
    before MLflow creates it, so a driver killed before it recorded the id finds the run again."""
    from vacsr.records.sweep_state import SweepState, start_recorded_run

    class KilledAfterCreate(SweepState):
        def update(self, dataset=None, **values):
            if "run_id" in values or "parent_run_id" in values:
                raise Killed
            super().update(dataset, **values)

    path, name = tmp_path / "sweep_state.json", dataset or "sweep"
    with pytest.raises(Killed):
        start_recorded_run(MlflowTracker(), KilledAfterCreate(path, fresh=True), dataset,
                           "killed-sweep", name)
    [orphan] = _runs_named("killed-sweep", name)

    resumed = SweepState(path, fresh=False)
    assert start_recorded_run(MlflowTracker(), resumed, dataset, "killed-sweep", name) == orphan
    assert _runs_named("killed-sweep", name) == [orphan]
    recorded = resumed.dataset(dataset) if dataset else resumed.data
    assert recorded.get("run_id", recorded.get("parent_run_id")) == orphan
    again = SweepState(path, fresh=False)  # what the next resume reads: the id, then its run
    assert start_recorded_run(MlflowTracker(), again, dataset, "killed-sweep", name) == orphan


@pytest.mark.timeout(150)
def test_a_dead_tracking_server_is_said_within_about_30_s(monkeypatch):
    """MLflow retried 7 times with doubling waits: a sweep stopped ~250 s after its server died."""
    import socket
    import time

    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as sock:  # a port that was free a moment ago, now closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(MlflowException, match="Max retries exceeded"):
        MlflowTracker(f"http://127.0.0.1:{port}").client.get_experiment_by_name("vacsr-train")
    assert 20 < time.monotonic() - start < 45


def test_a_tracked_train_writes_no_mlflow_info_lines(tmp_path, weights, capsys):
    """Creating the store, MLflow and alembic logged INFO lines to stderr: the console of a
    tracked `vacsr train` holds its results and warnings only."""
    from conftest import tracked_train

    err = tracked_train(tmp_path, weights, capsys, "data.num_train=16", "data.num_test=10",
                        "train.batch_size=16", "data.augment=false")
    assert [line for line in err.splitlines() if " INFO " in line] == []
