"""SIGTERM stops an embedded sweep driver cleanly: its runs closed, its Optuna trials failed, its
own Ray instance gone with every process; `--resume` then completes with nothing RUNNING."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1800)]

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
    log = open(tmp_path / f"driver{len(list(tmp_path.glob('driver*.log')))}.log", "w")
    return subprocess.Popen(
        [sys.executable, "sweeps/base2novel.py", "--datasets", "eurosat", "--storage",
         str(tmp_path), "--pretrained", str(weights), "--trials", "2", *extra],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log.name


def _wait_for(driver, log: str, done, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not done():
        assert driver.poll() is None and time.time() < deadline, Path(log).read_text()[-3000:]
        time.sleep(0.5)


def _records(uri: str) -> dict:
    """Every run of the sweep's experiment: status, end time, params, tags."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("vacsr-base2novel")
    return {r.info.run_id: (r.info.status, r.info.end_time, r.data.params, r.data.tags)
            for r in client.search_runs([experiment.experiment_id])}


def _check_selection_agrees(root: Path, uri: str) -> None:
    """The dataset run's params, best_config.yaml and the selected trial are one config: the
    best val selection saw (each trial run's `selection_val/acc`), ties to the trial that
    started first (trials/eurosat/trial_order.json)."""
    import yaml
    from mlflow import MlflowClient

    from vacsr.tracking import PARAMS_CHANGED_TAG

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("vacsr-base2novel").experiment_id])
    [dataset_run] = [r for r in runs if r.data.tags.get("vacsr.dataset") == "eurosat"]
    assert PARAMS_CHANGED_TAG not in dataset_run.data.tags, dataset_run.data.tags
    best = yaml.safe_load((root / "best" / "eurosat" / "best_config.yaml").read_text())
    searched = dataset_run.data.params
    assert searched and all(str(best[k.split(".")[0]][k.split(".")[1]]) == v
                            for k, v in searched.items()), (searched, best)
    order = json.loads((root / "trials" / "eurosat" / "trial_order.json").read_text())
    trials = {r.info.run_name.removeprefix("eurosat-"): r for r in runs
              if r.data.tags.get("mlflow.parentRunId") == dataset_run.info.run_id
              and r.info.run_name.removeprefix("eurosat-") in order}
    assert len(trials) == 2, sorted(trials)
    # what selection compared, on each trial's run: Tune's last result (a trial ASHA stopped may
    # log an epoch more before its workers stop), and it is the run's val/acc at that epoch
    val = {t: r.data.metrics["selection_val/acc"] for t, r in trials.items()}
    for t, r in trials.items():
        epoch = int(r.data.tags["vacsr.selection_epoch"])
        history = {m.step: m.value for m in client.get_metric_history(r.info.run_id, "val/acc")}
        assert history[epoch] == val[t], (t, epoch, history)
    chosen = min(trials, key=lambda t: (-val[t], order[t]))
    assert {k: trials[chosen].data.params[k] for k in searched} == searched, (val, order)
    assert dataset_run.data.metrics["best_val/acc"] == val[chosen]


def test_sigterm_stops_the_driver_cleanly_and_resume_completes(tmp_path, weights):
    """One folder, in turn: a second driver refused while the first trains; SIGTERM during a
    trial; a resume stopped by SIGTERM in the final phase; a resume that completes with the
    records of one clean selection; a new sweep in the used folder refused, records unchanged."""
    driver, log = _sweep(tmp_path, weights)
    state = tmp_path / "base2novel" / "sweep_state.json"
    _wait_for(driver, log, state.is_file, timeout=300)  # the folder is claimed
    second, second_log = _sweep(tmp_path, weights)
    assert second.wait(timeout=180) == 2, Path(second_log).read_text()[-3000:]
    refused = Path(second_log).read_text().strip().splitlines()
    assert refused[-1].startswith("vacsr: error: ") and \
        f"another sweep driver is running in this folder (pid {driver.pid} on" in refused[-1]
    trials = tmp_path / "base2novel" / "trials" / "eurosat"
    _wait_for(driver, log, lambda: trials.is_dir() and any(p.is_dir() for p in trials.iterdir()),
              timeout=300)  # a trial is training (a few seconds: stop it now)
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

    # stopped again one second after the last trial: the final phase (the case)
    resumed, log = _sweep(tmp_path, weights, "--resume")
    _wait_for(resumed, log, lambda: "eurosat: trial 2 done" in Path(log).read_text())
    time.sleep(1)
    resumed.send_signal(signal.SIGTERM)
    assert resumed.wait(timeout=120) == 128 + signal.SIGTERM, Path(log).read_text()[-3000:]

    resumed, log = _sweep(tmp_path, weights, "--resume")
    assert resumed.wait(timeout=600) == 0, Path(log).read_text()[-3000:]
    assert "| eurosat |" in Path(log).read_text()
    runs = mlflow.search_runs(experiment_names=["vacsr-base2novel"])
    assert (runs.status == "RUNNING").sum() == 0
    parents = runs[runs["tags.vacsr.kind"] == "base2novel"]
    assert len(parents) == 1 and parents.status.iloc[0] == "FINISHED"
    study = optuna.load_study(study_name="base2novel-eurosat", storage=study_db)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    _check_selection_agrees(tmp_path / "base2novel", uri)

    before = _records(uri)
    again, log = _sweep(tmp_path, weights)  # a new sweep, no --resume, in the used folder
    assert again.wait(timeout=180) == 2, Path(log).read_text()[-3000:]
    assert "holds the sweep 'base2novel' already" in Path(log).read_text()
    assert _records(uri) == before  # the earlier sweep's MLflow runs are unchanged
