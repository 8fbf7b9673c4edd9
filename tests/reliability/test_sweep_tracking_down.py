"""An MLflow server that dies mid-sweep: the driver stops in one line, closing nothing it cannot
reach, and once the server is back `--resume` completes the sweep with every run closed, each
trial run once.

The server sits behind basic auth and the sweep's --tracking-uri carries the password, so this is
also the whole-sweep test of tests/records/test_secrets.py: through the trials, the selection, the
final seed run, the report, the stop line and the resume, the password reaches the server's
requests and nothing else (the console, the sweep folder, the server's store, Ray's session
folders).

Its `--set` fixes two keys the sweep searches, so it is also the test of fixed keys across a
stop and a resume: no trial draws another value (the first trial is not the only one that has
it), the final run has it, the Optuna study holds no param for it, the dataset run does not list
it among the chosen keys, and each driver's console says so once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO
from tests.support.servers import basic_auth_proxy

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1800)]

USER, PASSWORD = "vacsr", "s3cr3t-pw"
FIXED = {"model.trainable_side": "last", "loss.beta": "0.5"}  # keys the sweep searches


def _sweep(tmp_path: Path, ray_temp: Path, weights, uri: str,
           *extra) -> tuple[subprocess.Popen, Path]:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
               RAY_TMPDIR=str(ray_temp),
               # a dead server fails each request at once instead of after minutes of retries
               MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="20")
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
                 "MLFLOW_TRACKING_PASSWORD"):
        env.pop(name, None)
    log = tmp_path / f"driver{len(list(tmp_path.glob('driver*.log')))}.log"
    driver = subprocess.Popen(
        # one trial at a time, in one reused actor: trials side by side are
        # tests/reliability/test_concurrent_sweep.py's subject, and each costs an actor's start
        [sys.executable, "sweeps/base2novel.py", "--datasets", "eurosat", "--trials", "2",
         "--seeds", "1", "--concurrent-trials", "1", "--storage", str(tmp_path),
         "--pretrained", str(weights),
         "--tracking-uri", uri, *sum((["--set", f"{k}={v}"] for k, v in FIXED.items()), []),
         *extra],
        cwd=REPO, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    return driver, log


def _serve(servers, proxies: list, backend: str, store: Path, log: Path, port: int = 0):
    """`mlflow server` over `backend` behind the auth proxy (on `port`, or a free one), the
    proxy added to `proxies`: (the server's process, the proxy, its port)."""
    url, process = servers.mlflow(backend, cwd=store, log=log)
    proxy, port = basic_auth_proxy(url, USER, PASSWORD, port)
    proxies.append(proxy)
    return process, proxy, port


def test_a_dead_tracking_server_stops_the_sweep_in_one_line_and_resume_completes(
        tmp_path, weights, servers, monkeypatch):
    store = tmp_path / "server"
    store.mkdir()
    backend = f"sqlite:///{store / 'mlflow.db'}"
    proxies = []
    ray_temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths
    try:
        server, proxy, port = _serve(servers, proxies, backend, store, tmp_path / "server.log")
        uri = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}"
        shown = f"http://{USER}:***@127.0.0.1:{port}"
        driver, log = _sweep(tmp_path, ray_temp, weights, uri)
        trials = tmp_path / "base2novel" / "trials" / "eurosat"
        deadline = time.time() + 300
        while not (trials.is_dir() and any(p.is_dir() for p in trials.iterdir())):
            assert driver.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(2)  # a trial trains, logging to the server
        proxy.shutdown()  # the address stops answering: connections are refused
        proxy.server_close()
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
        assert driver.wait(timeout=900) == 2, log.read_text()[-3000:]
        output = log.read_text()
        assert "Traceback" not in output, output[-3000:]
        [line] = [t for t in output.splitlines() if t.startswith("vacsr:")]
        assert line.startswith(f"vacsr: error: --tracking-uri {shown}: the MLflow server "
                               "stopped answering (no answer"), line
        assert line.endswith("restart the server, then continue with --resume"), line

        _serve(servers, proxies, backend, store, tmp_path / "server.log", port)
        resumed, log = _sweep(tmp_path, ray_temp, weights, uri, "--resume")
        assert resumed.wait(timeout=900) == 0, log.read_text()[-3000:]
        assert shown in log.read_text()  # the MLflow UI hint, the password taken out
        assert "| eurosat |" in log.read_text()
        files = [p for root in (tmp_path, ray_temp) for p in root.rglob("*")
                 if p.is_file() and not p.is_symlink() and not p.is_socket()]
        assert any(p.name == "best_config.yaml" for p in files)  # what was searched is there
        assert any("logs" in p.parts for p in files)  # so are Ray's session logs
        # both drivers' output, the sweep folder, the server's store, Ray's sessions
        assert [p for p in files if PASSWORD.encode() in p.read_bytes()] == []
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
        _check_runs(f"http://127.0.0.1:{port}")
        _check_study(tmp_path / "base2novel" / "optuna.db")
        _check_fixed_keys(f"http://127.0.0.1:{port}", tmp_path / "base2novel",
                          sorted(tmp_path.glob("driver*.log")))
    finally:
        subprocess.run(["rm", "-rf", str(ray_temp)], timeout=60)
        for proxy in proxies:
            proxy.shutdown()
            proxy.server_close()


def _check_runs(uri: str) -> None:
    """Every run of the sweep closed, each trial run once, no param holding the password."""
    from mlflow import MlflowClient

    from vacsr.sweep.search.tune import ASHA_RUNG_TAG

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("vacsr-base2novel").experiment_id
    runs = client.search_runs([experiment])
    # closed: FINISHED, or KILLED for a trial ASHA stopped (its run says at which rung); which
    # trial reaches a rung first after the resume depends on timing
    open_or_cut = [(r.info.run_name, r.info.status) for r in runs if r.info.status != "FINISHED"
                   and not (r.info.status == "KILLED" and ASHA_RUNG_TAG in r.data.tags)]
    assert open_or_cut == [], [(r.info.run_name, r.info.status) for r in runs]
    names = sorted(r.info.run_name for r in runs)
    trial_runs = [n for n in names if n.startswith("eurosat-") and "final" not in n]
    assert len(trial_runs) == len(set(trial_runs)) == 2, names  # each trial run once
    assert names.count("eurosat") == names.count("base2novel") == 1, names
    assert not [r for r in runs for value in r.data.params.values() if PASSWORD in value]


def _check_study(db: Path) -> None:
    """Each trial's value reached the Optuna study once, those resumed after the outage too (on
    a fresh Optuna trial: the one the outage ended is FAIL)."""
    import optuna

    from vacsr.sweep.search.optuna_searcher import TUNE_TRIAL_ATTR

    study = optuna.load_study(study_name="base2novel-eurosat", storage=f"sqlite:///{db}")
    told = [t.user_attrs[TUNE_TRIAL_ATTR] for t in study.trials if t.state.name == "COMPLETE"]
    assert len(told) == len(set(told)) == 2, [(t.state.name, t.user_attrs) for t in study.trials]


def _check_fixed_keys(uri: str, sweep: Path, logs: list[Path]) -> None:
    """`--set` on searched keys (FIXED): every trial and the final run have the value, the
    study and the dataset run's chosen keys do not, best_config.yaml has it, and each driver's
    console notes it once."""
    import optuna
    import yaml
    from mlflow import MlflowClient

    for log in logs:
        notes = [line for line in log.read_text().splitlines()
                 if line.startswith("--set fixes searched keys")]
        assert len(notes) == 1 and all(f"{k}={v}" in notes[0] for k, v in FIXED.items()), notes
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("vacsr-base2novel").experiment_id])
    [dataset] = [r for r in runs if r.data.tags.get("vacsr.dataset") == "eurosat"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == dataset.info.run_id]
    finals = [r for r in children if "final" in r.info.run_name]
    assert len(children) == 3 and len(finals) == 1, [r.info.run_name for r in children]
    for key, value in FIXED.items():
        assert [r.data.params[key] for r in children] == [value] * 3, key
    chosen = dataset.data.params  # the searched keys alone
    assert "loss.gamma" in chosen and not set(FIXED) & set(chosen), chosen
    best = yaml.safe_load((sweep / "best" / "eurosat" / "best_config.yaml").read_text())
    assert (best["model"]["trainable_side"], best["loss"]["beta"]) == ("last", 0.5)
    study = optuna.load_study(study_name="base2novel-eurosat",
                              storage=f"sqlite:///{sweep / 'optuna.db'}")
    for trial in study.trials:
        assert "loss.gamma" in trial.params and not set(FIXED) & set(trial.params), trial.params
