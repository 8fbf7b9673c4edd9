"""A sweep never silently picks a failed run, and never joins a Ray cluster it was not given."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.ray]



@pytest.mark.timeout(600)
def test_a_dataset_whose_trials_all_fail_is_reported_and_the_sweep_goes_on(tmp_path,
                                                                           weights):
    """The trial diverges (lr 1e30): Tune's retries of it end at once on the recorded error, its
    run is FAILED in MLflow and never selected, no final run is attempted, the table reports the
    dataset as failed, and the sweep ends with exit status 1, one summary line and no MLflow run
    left RUNNING. Its TMPDIR keeps nothing of the run but Ray's session logs (no `pymp-*`
    listener folder of the dashboard's processes)."""
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TMPDIR=str(temp))
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "RAY_TMPDIR"):  # mlflow exports its URI
        env.pop(name, None)
    try:
        out = subprocess.run(
            [sys.executable, "sweeps/base2novel.py", "--datasets", "eurosat", "--storage",
             str(tmp_path), "--pretrained", str(weights), "--trials", "1",
             "--set", "optim.lr=1e30"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
        # torch's compile cache and Ray's file locks, kept across runs by design
        left = sorted(p.name for p in temp.iterdir()
                      if not p.name.startswith(("torchinductor", "_ray_lockfiles")))
    finally:
        subprocess.run(["rm", "-rf", str(temp)], timeout=60)
    assert left == ["ray"], left
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "vacsr: 1 dataset(s) failed: eurosat: none of 1 trial(s) reported val/acc (1 failed)" \
        in out.stderr, out.stderr[-2000:]
    assert "training diverged" in out.stderr
    table = (tmp_path / "base2novel" / "report" / "results.md").read_text()
    assert "| eurosat | FAILED:" in table

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'base2novel' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["vacsr-base2novel"])
    assert (runs.status == "RUNNING").sum() == 0
    trials = runs[runs["tags.mlflow.runName"].str.startswith("eurosat-")]
    assert len(trials) == 1 and set(trials.status) == {"FAILED"}
    assert not runs["tags.mlflow.runName"].str.contains("final").any()
    dataset = runs[runs["tags.vacsr.dataset"] == "eurosat"]
    assert list(dataset.status) == ["FAILED"]
    # the reason the report gives, on the run (`vacsr best --compare` reads it)
    [why] = dataset["tags.vacsr.failed"]
    assert why.startswith("none of 1 trial(s) reported val/acc") and f"| eurosat | FAILED: " \
        f"{why} |" in table, (why, table)


@pytest.mark.timeout(180)
def test_the_embedded_default_never_joins_a_recorded_cluster(tmp_path):
    """`ray start` records its address in <ray temp dir>/ray_current_cluster and leaves it behind
    when its processes die without `ray stop`; a sweep without --ray-address must start a local
    instance of its own instead of failing to join that one."""
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths
    (temp / "ray").mkdir()
    (temp / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")  # nothing listens there
    code = ("from vacsr.distributed.cluster import ensure_ray; import ray; "
            "ensure_ray(num_cpus=1, include_dashboard=False); "
            "print('local', ray.cluster_resources()['CPU']); ray.shutdown()")
    env = dict(os.environ, RAY_TMPDIR=str(temp), RAY_USAGE_STATS_ENABLED="0")
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):  # mlflow.set_tracking_uri exports it
        env.pop(name, None)
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=150)
    finally:
        subprocess.run(["rm", "-rf", str(temp)], timeout=60)
    assert out.returncode == 0 and "local 1.0" in out.stdout, out.stderr[-2000:]
