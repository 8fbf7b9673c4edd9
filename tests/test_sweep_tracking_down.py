"""An MLflow server that dies mid-sweep: the driver stops in one line, closing nothing it cannot
reach, and once the server is back `--resume` completes the sweep with every run closed, each
trial run once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[1]


def _sweep(tmp_path: Path, weights, uri: str, *extra) -> tuple[subprocess.Popen, Path]:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
               # a dead server fails each request at once instead of after minutes of retries
               MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="20")
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    log = tmp_path / f"driver{len(list(tmp_path.glob('driver*.log')))}.log"
    driver = subprocess.Popen(
        [sys.executable, "sweeps/base2novel.py", "--datasets", "eurosat", "--trials", "2",
         "--seeds", "1", "--storage", str(tmp_path), "--pretrained", str(weights),
         "--tracking-uri", uri, *extra],
        cwd=REPO, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    return driver, log


def test_a_dead_tracking_server_stops_the_sweep_in_one_line_and_resume_completes(tmp_path,
                                                                                 weights,
                                                                                 servers):
    from mlflow import MlflowClient

    store, port = tmp_path / "server", free_port()
    store.mkdir()
    backend = f"sqlite:///{store / 'mlflow.db'}"
    uri, server = servers.mlflow(backend, port, cwd=store, log=tmp_path / "server.log")
    driver, log = _sweep(tmp_path, weights, uri)
    trials = tmp_path / "base2novel" / "trials" / "eurosat"
    deadline = time.time() + 300
    while not (trials.is_dir() and any(p.is_dir() for p in trials.iterdir())):
        assert driver.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    time.sleep(2)  # a trial trains, logging to the server
    os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=30)
    assert driver.wait(timeout=900) == 2, log.read_text()[-3000:]
    output = log.read_text()
    assert "Traceback" not in output, output[-3000:]
    [line] = [t for t in output.splitlines() if t.startswith("vacsr:")]
    assert line.startswith(f"vacsr: error: --tracking-uri {uri}: the MLflow server stopped "
                           "answering (no answer"), line
    assert line.endswith("restart the server, then continue with --resume"), line

    servers.mlflow(backend, port, cwd=store, log=tmp_path / "server.log")
    resumed, log = _sweep(tmp_path, weights, uri, "--resume")
    assert resumed.wait(timeout=900) == 0, log.read_text()[-3000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("vacsr-base2novel").experiment_id
    runs = client.search_runs([experiment])
    assert {r.info.status for r in runs} == {"FINISHED"}, \
        [(r.info.run_name, r.info.status) for r in runs]
    names = sorted(r.info.run_name for r in runs)
    trial_runs = [n for n in names if n.startswith("eurosat-") and "final" not in n]
    assert len(trial_runs) == len(set(trial_runs)) == 2, names  # each trial run once
    assert names.count("eurosat") == names.count("base2novel") == 1, names
    assert "| eurosat |" in log.read_text()
