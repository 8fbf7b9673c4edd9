"""`--plan` stopped while its calibration runs: SIGINT and SIGTERM end it with the sweep's one
stop line and 128 + the signal's number, its calibration folder removed; a folder a SIGKILLed
run left is cleared by the next start, once its owner is gone."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO
from vacsr.sweep.cost.calibrate import CALIBRATION_PREFIX, clear_stale_calibrations

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_calibrating_is_one_line_and_leaves_nothing(tmp_path, signum):
    # the run's own TMPDIR: what it leaves is all there (short: Ray's socket paths live in it)
    temp = Path(tempfile.mkdtemp(prefix="vacsr-plan-stop-", dir="/tmp"))
    try:
        _stop_while_calibrating(tmp_path, temp, signum)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _stop_while_calibrating(tmp_path: Path, temp: Path, signum: int) -> None:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TMPDIR=str(temp), PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)
    # --recalibrate: costs the test run keeps would skip the calibration this stops
    plan = subprocess.Popen(
        [sys.executable, "sweeps/base2novel.py", "--plan", "--recalibrate", "--datasets", "dtd",
         "--storage", str(tmp_path / "sweeps")], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    # calibrating: the calibration's Tune experiment exists in its folder
    while not list(temp.glob(f"{CALIBRATION_PREFIX}*/calibration*")):
        assert plan.poll() is None and time.time() < deadline, plan.communicate()
        time.sleep(0.1)
    plan.send_signal(signum)
    out, err = plan.communicate(timeout=120)
    assert plan.returncode == 128 + signum, err
    assert err.splitlines() == [f"vacsr: stopped by {signal.Signals(signum).name}; --plan wrote "
                                "nothing"], err
    assert out == ""
    assert list(temp.glob(f"{CALIBRATION_PREFIX}*")) == []
    assert not (tmp_path / "sweeps").exists()


def test_stale_calibration_folders_of_dead_owners_are_cleared(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid whose process has ended
    stale = tmp_path / f"{CALIBRATION_PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{CALIBRATION_PREFIX}{os.getppid()}-def"  # its owner runs
    unknown = tmp_path / f"{CALIBRATION_PREFIX}xyz"  # no owner named: not ours to judge
    for folder in (stale, live, unknown):
        (folder / "calibration").mkdir(parents=True)
    assert clear_stale_calibrations(tmp_path) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, unknown.name])
    assert Path(live / "calibration").is_dir()
