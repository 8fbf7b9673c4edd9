"""`vacsr train` stopped by SIGTERM, SIGHUP or Ctrl-C: its MLflow run KILLED, one line, exit
143 / 129 / 130."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]



@pytest.fixture(scope="module")
def template_db(tmp_path_factory) -> Path:
    """A migrated MLflow database: creating one costs seconds, copying it nothing."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def _argv(tmp_path, weights, template_db) -> tuple[list[str], str, Path]:
    shutil.copy(template_db, tmp_path / "mlflow.db")
    uri, run = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    return (["train", f"model.pretrained={weights}", "data.num_train=64", "data.num_test=10",
             "train.batch_size=16", "train.epochs=500", "adapter.hidden_dim=16",
             "data.augment=false", "train.progress=false", "train.device=cpu",
             "tracking.enabled=true", f"tracking.uri={uri}", f"train.output_dir={run}"], uri, run)


def _wait_for_training(run: Path, alive=lambda: True) -> None:
    deadline = time.time() + 240
    while not (run / "last.ckpt").is_file():  # the run is open and its first epoch saved
        assert alive() and time.time() < deadline
        time.sleep(0.2)


def _status(uri: str, run: Path) -> str:
    from mlflow import MlflowClient

    run_id = json.loads((run / "mlflow_run.json").read_text())["run_id"]
    return MlflowClient(uri).get_run(run_id).info.status


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_closes_the_run_as_killed_and_exits_128_plus_it(tmp_path, weights,
                                                                          template_db, signum):
    """SIGHUP (a closed terminal, a dropped ssh session) stops the run as SIGTERM does."""
    argv, uri, run = _argv(tmp_path, weights, template_db)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    driver = subprocess.Popen([sys.executable, "-m", "vacsr.cli", *argv], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_training(run, alive=lambda: driver.poll() is None)
        driver.send_signal(signum)
        _, err = driver.communicate(timeout=120)
    finally:
        driver.kill()
    assert driver.returncode == 128 + signum, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        f"vacsr: stopped by {signum.name}; an MLflow run it had open is closed as KILLED"), err
    assert _status(uri, run) == "KILLED"


def test_ctrl_c_closes_the_run_as_killed_and_exits_130(tmp_path, weights, template_db, capsys):
    from vacsr.cli import main

    argv, uri, run = _argv(tmp_path, weights, template_db)
    before = signal.getsignal(signal.SIGINT)  # another library in this process may have set one
    interrupt = threading.Thread(target=lambda: (_wait_for_training(run),
                                                 os.kill(os.getpid(), signal.SIGINT)))
    interrupt.start()
    code = main(argv)
    interrupt.join()
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("vacsr: stopped by SIGINT; an MLflow run")
    assert _status(uri, run) == "KILLED"
    assert signal.getsignal(signal.SIGINT) is before  # the run restored the handler it found


def test_a_stop_inside_a_store_write_waits_for_it_and_the_run_closes_killed(tmp_path, template_db):
    """The signal lands while MLflow's SQLite transaction is open (the hook runs inside it):
    raised there, it would leave the database locked, and closing the run as KILLED would fail
    after the store's busy timeout."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from vacsr.records import MlflowTracker
    from vacsr.stop import Stopped, stop_on_signals

    shutil.copy(template_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri)
    run_id = tracker.start("signals", "run")
    inside = []

    def interrupt(conn, cursor, statement, *rest):
        if statement.startswith("INSERT INTO metrics") and not inside:
            inside.append(statement)
            os.kill(os.getpid(), signal.SIGINT)

    event.listen(Engine, "before_cursor_execute", interrupt)
    started = time.monotonic()
    try:
        with pytest.raises(Stopped), stop_on_signals():
            try:
                tracker.log_epoch(0, {"loss": 0.5})
            except KeyboardInterrupt:
                tracker.finish("KILLED")
                raise
    finally:
        event.remove(Engine, "before_cursor_execute", interrupt)
    assert inside and time.monotonic() - started < 10  # not a wait on the store's lock
    from mlflow import MlflowClient

    run = MlflowClient(uri).get_run(run_id)
    assert run.info.status == "KILLED"
    assert [m.value for m in MlflowClient(uri).get_metric_history(run_id, "loss")] == [0.5]
