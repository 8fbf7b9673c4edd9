"""SIGTERM stops an embedded sweep driver cleanly: its runs closed, its Optuna trials failed, its
own Ray instance gone with every process; `--resume` then completes with nothing RUNNING."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]


def _children() -> dict[int, int]:
    """pid -> parent pid of every process (read from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return parents


def _descendants(root: int) -> set[int]:
    parents, found, frontier = _children(), set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _sweep(tmp_path, weights, *extra):
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):  # mlflow.set_tracking_uri exports it
        env.pop(name, None)
    log = open(tmp_path / f"driver{len(extra)}.log", "w")
    return subprocess.Popen(
        [sys.executable, "sweeps/base2novel.py", "--datasets", "eurosat", "--storage",
         str(tmp_path), "--pretrained", str(weights), "--trials", "2", *extra],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log.name


def test_sigterm_stops_the_driver_cleanly_and_resume_completes(tmp_path, tiny_weights):
    driver, log = _sweep(tmp_path, tiny_weights)
    trials = tmp_path / "base2novel" / "trials" / "eurosat"
    deadline = time.time() + 300
    while not (trials.is_dir() and any(trials.iterdir())):  # a trial is training
        assert driver.poll() is None and time.time() < deadline, Path(log).read_text()[-3000:]
        time.sleep(1)
    time.sleep(3)
    ray_processes = _descendants(driver.pid)
    assert ray_processes, "the embedded Ray runs under the driver"
    driver.send_signal(signal.SIGTERM)
    code = driver.wait(timeout=120)
    output = Path(log).read_text()
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "vacsr: stopped by SIGTERM" in output and "Traceback" not in output, output[-3000:]
    deadline = time.time() + 30
    while _alive(ray_processes) and time.time() < deadline:
        time.sleep(1)
    assert not _alive(ray_processes), "processes of the driver's Ray instance left running"

    import mlflow
    import optuna

    uri = f"sqlite:///{tmp_path / 'base2novel' / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["vacsr-base2novel"])
    assert (runs.status == "RUNNING").sum() == 0 and "KILLED" in set(runs.status)
    study_db = f"sqlite:///{tmp_path / 'base2novel' / 'optuna.db'}"
    study = optuna.load_study(study_name="base2novel-eurosat", storage=study_db)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]

    resumed, log = _sweep(tmp_path, tiny_weights, "--resume")
    assert resumed.wait(timeout=600) == 0, Path(log).read_text()[-3000:]
    assert "| eurosat |" in Path(log).read_text()
    runs = mlflow.search_runs(experiment_names=["vacsr-base2novel"])
    assert (runs.status == "RUNNING").sum() == 0
    parents = runs[runs["tags.vacsr.kind"] == "base2novel"]
    assert len(parents) == 1 and parents.status.iloc[0] == "FINISHED"
    study = optuna.load_study(study_name="base2novel-eurosat", storage=study_db)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
