"""A rehearsal of a whole sweep (`--rehearse`) on a local Ray, its MLflow store and Optuna studies
on a real PostgreSQL server (tests/support/postgres.py): SIGKILLed while it searches and resumed,
it ends as a real sweep does (every run closed, every trial told to the study, the final seeds,
the report), with every MLflow run marked, the report opening with the rehearsal's header, and
its records refused as results: by `vacsr best`, and by a real sweep's `--resume`. Its parts
without Ray: tests/sweep/test_rehearsal.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from tests.support.postgres import PASSWORD, create_database, start_postgresql
from vacsr.records.database_url import with_driver

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(900)]

DATASETS = ("eurosat", "dtd")


def _driver(storage: Path, weights: Path, stores: tuple[str, str],
            *extra: str) -> tuple[subprocess.Popen, Path]:
    """The sweep's driver on `stores` (MLflow's, Optuna's), run in `storage`: MLflow puts a
    database store's artifacts in ./mlruns of the process that creates the experiment. A
    dataset's trials run one after the other in one reused actor (rehearsed trials side by side
    are benchmarks/bench_scale.py's subject, and each actor costs its start)."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    storage.mkdir(parents=True, exist_ok=True)
    log = storage / f"driver{len(list(storage.glob('driver*.log')))}.log"
    return subprocess.Popen(
        [sys.executable, str(REPO / "sweeps" / "base2novel.py"), "--datasets",
         ",".join(DATASETS), "--storage", str(storage), "--pretrained", str(weights),
         "--trials", "3", "--seeds", "1,2", "--concurrent-trials", "1", "--tracking-uri",
         stores[0], "--optuna-storage", stores[1], *extra], cwd=storage, env=env,
        stdout=open(log, "w"), stderr=subprocess.STDOUT), log


def test_a_killed_rehearsal_resumes_to_a_marked_report_that_is_never_a_result(tmp_path,
                                                                              weights, servers):
    import optuna
    from mlflow import MlflowClient

    from vacsr.records.names import REHEARSAL_TAG

    server = start_postgresql(servers)
    stores = (create_database(server, "mlflow"), create_database(server, "optuna"))
    root = tmp_path / "base2novel"
    driver, log = _driver(tmp_path, weights, stores, "--rehearse", "20")
    deadline = time.time() + 300
    while not any((root / "trials" / d).is_dir() and any((root / "trials" / d).iterdir())
                  for d in DATASETS):
        assert driver.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    time.sleep(1)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=60)

    # a real sweep never continues a rehearsal
    real, log = _driver(tmp_path, weights, stores, "--resume")
    assert real.wait(timeout=120) == 2, log.read_text()[-3000:]
    assert log.read_text().strip().splitlines()[-1] == (
        f"vacsr: error: --resume: sweep 'base2novel' in {root} is a rehearsal; continue it with "
        "--rehearse, or run the real sweep with another --name or --storage")

    resumed, log = _driver(tmp_path, weights, stores, "--resume", "--rehearse", "20")
    assert resumed.wait(timeout=600) == 0, log.read_text()[-3000:]
    output = log.read_text()
    assert "rehearsal (--rehearse 20): Ray, Tune, Optuna, MLflow and checkpoints run" in output
    assert PASSWORD not in output  # the stores' password is masked wherever printed
    report = (root / "report" / "results.md").read_text()
    assert report.startswith("**Rehearsal** (--rehearse 20): no run trained")
    assert "| eurosat |" in report and "| dtd |" in report

    client = MlflowClient(with_driver(stores[0]))
    runs = client.search_runs([client.get_experiment_by_name("vacsr-base2novel").experiment_id])
    names = sorted(r.info.run_name for r in runs)
    assert [r.info.run_name for r in runs if r.data.tags.get(REHEARSAL_TAG) != "20"] == [], names
    assert "RUNNING" not in {r.info.status for r in runs}, names
    for dataset in DATASETS:  # three trials each, a run each, and both final seeds
        trials = [n for n in names if n.startswith(f"{dataset}-") and "final" not in n]
        assert len(trials) >= 3, names  # a trial the kill lost is created again
        assert f"{dataset}-final-seed1" in names and f"{dataset}-final-seed2" in names
        study = optuna.load_study(study_name=f"base2novel-{dataset}",
                                  storage=with_driver(stores[1]))
        assert sum(t.state.name == "COMPLETE" for t in study.trials) == 3
        assert {t.state.name for t in study.trials} <= {"COMPLETE", "FAIL"}

    out = subprocess.run([str(Path(sys.executable).parent / "vacsr"), "best", "--tracking-uri",
                          stores[0]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith(
        "vacsr: error: sweep 'base2novel' in experiment 'vacsr-base2novel' is a rehearsal "
        "(--rehearse 20)"), out.stderr[-2000:]
