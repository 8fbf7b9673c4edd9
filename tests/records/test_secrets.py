"""A password in the tracking URI reaches MLflow (through its own environment variables) and
nothing else: no console line, log record, param, artifact or file holds it. A whole sweep with
one, stopped by its server's death and resumed, is
tests/reliability/test_sweep_tracking_down.py."""
from __future__ import annotations

import logging
import os

import pytest
import torch

from tests.support.servers import basic_auth_proxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PASSWORD = "s3cr3t-pw"
USER = "vacsr"


@pytest.fixture
def mlflow_server(tmp_path, servers):
    """`mlflow server` over a SQLite store behind the auth proxy: (the store's folder, the
    proxy's port)."""
    store = tmp_path / "server"
    store.mkdir()
    url, _ = servers.mlflow(f"sqlite:///{store / 'mlflow.db'}", cwd=store)
    proxy, proxy_port = basic_auth_proxy(url, USER, PASSWORD)
    try:
        yield store, proxy_port
    finally:
        proxy.shutdown()  # before `servers` stops the server


def test_a_password_in_the_uri_reaches_mlflow_and_nothing_else(tmp_path, mlflow_server,
                                                               monkeypatch, capsys, caplog):
    from mlflow import MlflowClient

    from vacsr.cli import main
    from vacsr.model.backbone import create_clip

    store, port = mlflow_server
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    weights = tmp_path / "random-tiny.pt"
    torch.save(create_clip("vacsr-tiny")[0].state_dict(), weights)
    uri = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}"
    caplog.set_level(logging.DEBUG)
    code = main(["train", f"model.pretrained={weights}", "data.num_train=16", "data.num_test=10",
                 "train.batch_size=16", "train.epochs=1", "adapter.hidden_dim=16",
                 "data.augment=false", "train.progress=false", "train.device=cpu",
                 "tracking.enabled=true", f"tracking.uri={uri}",
                 f"train.output_dir={tmp_path / 'run'}"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "View run" in out  # MLflow's own line is there, without the password
    shown = f"http://{USER}:***@127.0.0.1:{port}"
    assert PASSWORD not in out + err + caplog.text
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
    assert leaks == []  # run folder (config.yaml, last.ckpt, mlflow_run.json), server store
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    client = MlflowClient(f"http://127.0.0.1:{port}")
    [run] = client.search_runs([client.get_experiment_by_name("vacsr-train").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["tracking.uri"] == shown
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "config.yaml" in artifacts and any(store.rglob("config.yaml"))


@pytest.mark.parametrize("uri", ["postgresql+psycopg://vacsr:s3cr3t-pw@db:5432/mlflow",
                                 "postgresql+psycopg://postgres@/mlflow?host=/run/pg",
                                 "mysql+pymysql://vacsr:s3cr3t-pw@db/mlflow"])
def test_a_database_uri_keeps_its_login_for_mlflow(uri, monkeypatch):
    """The basic-auth rule is a tracking server's: a database URI reaches MLflow's SQL store
    whole (its `//` and its password), and sets no server credentials."""
    from vacsr.records.client import MLFLOW_PASSWORD_ENV, MLFLOW_USER_ENV, client_uri

    for name in (MLFLOW_USER_ENV, MLFLOW_PASSWORD_ENV):
        monkeypatch.delenv(name, raising=False)
    assert client_uri(uri) == uri
    assert MLFLOW_USER_ENV not in os.environ and MLFLOW_PASSWORD_ENV not in os.environ


def test_a_servers_uri_gives_its_login_to_mlflows_variables(monkeypatch):
    from vacsr.records.client import MLFLOW_PASSWORD_ENV, MLFLOW_USER_ENV, client_uri

    for name in (MLFLOW_USER_ENV, MLFLOW_PASSWORD_ENV):
        monkeypatch.delenv(name, raising=False)
    assert client_uri(f"https://{USER}:{PASSWORD}@mlflow:5000") == "https://mlflow:5000"
    assert (os.environ[MLFLOW_USER_ENV], os.environ[MLFLOW_PASSWORD_ENV]) == (USER, PASSWORD)


def _beta_space(trial) -> None:
    trial.suggest_float("loss.beta", 0.1, 10.0, log=True)


def test_a_database_password_stays_out_of_the_pickled_search_and_a_resume_finds_its_storage(
        tmp_path, servers):
    """A study database's URL as users write it (`postgresql://user:password@...`, no driver):
    opened with the installed driver; the searcher Tune pickles (its Tuner and its checkpoint,
    both in the sweep's folder) holds the URL masked, and unpickled it goes on with the storage
    the sweep opened from its --optuna-storage, its earlier trial still its own; unpickled where
    no such storage was opened, one line naming the masked URL."""
    import pickle

    from conftest import built_plan
    from sweeps.base2novel import SWEEP
    from tests.support.postgres import PASSWORD as DB_PASSWORD
    from tests.support.postgres import create_database, start_postgresql
    from vacsr.errors import ConfigError
    from vacsr.sweep.plan import studies
    from vacsr.sweep.search.optuna_searcher import OptunaStudySearch

    url = create_database(start_postgresql(servers), "optuna")
    storage = studies.open_optuna_storage(built_plan(SWEEP, tmp_path, optuna_url=url))
    assert storage.url.startswith("postgresql+psycopg://")  # psycopg 3, the cluster extra's

    search = OptunaStudySearch(_beta_space, metric="val/acc", mode="max", storage=storage,
                               study_name="s", seed=0, points_to_evaluate=[{"loss.beta": 1.0}])
    assert search.suggest("t1") == {"loss": {"beta": 1.0}}
    search.save(str(tmp_path / "searcher.pkl"))
    saved = [pickle.dumps(search), (tmp_path / "searcher.pkl").read_bytes()]
    assert not [blob for blob in saved if DB_PASSWORD.encode() in blob]
    assert b"vacsr:***@127.0.0.1" in saved[0]

    restored = pickle.loads(saved[0])
    restored.on_trial_complete("t1", {"val/acc": 5.0})
    assert restored.suggest("t2")["loss"]["beta"] > 0
    # t1 told on a new trial of its parameters; the one the stopped process left RUNNING is
    # FAIL, as a stop that could close its records leaves it
    trials = restored._study.trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE", "RUNNING"]
    assert trials[1].value == 5.0 and trials[1].params == trials[0].params

    shown = f"postgresql+psycopg://vacsr:***@{url.split('@')[1]}"
    studies._OPENED.clear()  # another process: nothing opened from --optuna-storage
    with pytest.raises(ConfigError) as refused:
        pickle.loads(saved[0])
    assert str(refused.value).startswith(f"--optuna-storage {shown}: the sweep's saved search")
