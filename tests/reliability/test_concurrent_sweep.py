"""The same table at any concurrency: a base-to-novel sweep running 4 trials of its dataset at
once on 4 logical GPUs, with real (tiny) training, gives one table run after run, and after a
SIGKILL mid-search and --resume: the same results.md and best config, the same Optuna
parameters and values for each trial (by its place in the creation order) and the same ASHA
stops (vacsr/sweep/search/asha.py, optuna_searcher.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1500)]

DATASET = "dtd"


@pytest.fixture(scope="module")
def cluster():
    """One node with 4 logical GPUs and 4 logical CPUs (Ray's multi-node test helper; the nodes
    stop by pid at the end). A GPU is a resource count: the runs train on the CPU."""
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "num_gpus": 4, "include_dashboard": False})
    yield nodes.address
    nodes.shutdown()


def _sweep(storage: Path, address: str, weights: Path, *extra: str):
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    storage.mkdir(parents=True, exist_ok=True)
    log = storage / f"driver{len(list(storage.glob('driver*.log')))}.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(
            [sys.executable, "sweeps/base2novel.py", "--ray-address", address, "--datasets",
             DATASET, "--storage", str(storage), "--pretrained", str(weights), "--trials", "8",
             "--seeds", "1", "--range", "train.epochs=int:3:5", "--concurrent-trials", "4",
             "--gpus-per-worker", "1", "--cpus-per-worker", "1", "--set", "train.device=cpu",
             # TPE models the study from the third told trial: trial k >= 5 waits for the values
             # of trials 0..k-4 (Optuna's default 10 would leave all 8 draws random)
             "--startup-trials", "2", *extra],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    return driver, log


def _finished(driver, log: Path) -> None:
    assert driver.wait(timeout=900) == 0, log.read_text()[-3000:]


def _records(root: Path) -> dict:
    """What the acceptance compares, each trial named by its creation index: the table, the
    best config, each told trial's parameters and value, each trial's ASHA stop rung."""
    import optuna
    from mlflow import MlflowClient

    from vacsr.sweep.search.optuna_searcher import CREATION_ATTR
    from vacsr.sweep.search.selection import creation_order

    storage = optuna.storages.RDBStorage(f"sqlite:///{root / 'optuna.db'}")
    study = optuna.load_study(study_name=f"base2novel-{DATASET}", storage=storage)
    told = [(t.user_attrs[CREATION_ATTR], t.params, t.value) for t in study.trials
            if t.state.name == "COMPLETE"]
    assert len({i for i, _, _ in told}) == len(told), told  # each trial told once
    told = {i: (params, value) for i, params, value in told}
    # Tune trial id -> creation index; a trial repeated on --resume (Tune lost it after the
    # study was told its value) is found in the study's attributes
    index = creation_order(storage, study.study_name)
    storage.engine.dispose()
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("vacsr-base2novel")
    stops = {}
    for run in client.search_runs([experiment.experiment_id]):
        trial = run.info.run_name.removeprefix(f"{DATASET}-")
        if trial in index and "vacsr.selection_epoch" in run.data.tags:
            stops[index[trial]] = (run.data.tags.get("vacsr.asha_stop_rung"),
                                   run.data.tags["vacsr.selection_epoch"])
    best = (root / "best" / DATASET / "best_config.yaml").read_text()
    return {"results.md": (root / "report" / "results.md").read_text(),
            "best_config.yaml": best.replace(str(root.parent), "<storage>"),
            "told": told, "stops": stops}


def test_four_trials_at_once_give_one_table_run_again_or_killed_and_resumed(tmp_path, cluster,
                                                                            tiny_weights):
    weights = tiny_weights  # pretrained: trials differ, so ASHA has trials to stop
    first, log = _sweep(tmp_path / "first", cluster, weights)
    _finished(first, log)
    reference = _records(tmp_path / "first" / "base2novel")
    assert len(reference["told"]) == 8 and len(reference["stops"]) == 8
    assert "4 concurrent trial(s) each" in log.read_text()

    again, log = _sweep(tmp_path / "again", cluster, weights)
    killed, killed_log = _sweep(tmp_path / "killed", cluster, weights)  # beside it: other timing
    trials = tmp_path / "killed" / "base2novel" / "trials" / DATASET
    deadline = time.time() + 600
    while len([p for p in trials.glob("*") if p.is_dir()]) < 5:  # mid-search
        assert killed.poll() is None and time.time() < deadline, killed_log.read_text()[-3000:]
        time.sleep(0.2)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    _finished(again, log)
    resumed, log = _sweep(tmp_path / "killed", cluster, weights, "--resume")
    _finished(resumed, log)

    assert _records(tmp_path / "again" / "base2novel") == reference
    assert _records(tmp_path / "killed" / "base2novel") == reference
