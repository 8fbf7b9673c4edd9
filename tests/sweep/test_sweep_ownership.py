"""A sweep folder belongs to one sweep: one driver at a time (an OS lock the kernel drops on
SIGKILL), a used folder only with --resume, and --resume only with the settings it started with."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import sweep_plan
from sweeps.base2novel import SWEEP as BASE2NOVEL
from vacsr.errors import ConfigError
from vacsr.sweep.plan.ownership import LOCK_FILE, DriverLock, claim_state
from vacsr.sweep.search.resume_files import check_resume_files

TWO = ["--datasets", "eurosat,dtd", "--trials", "2"]  # the sweep of these tests


def test_a_second_driver_is_refused_until_the_first_dies(tmp_path):
    folder = tmp_path / "sweep"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from vacsr.sweep.plan.ownership import DriverLock; DriverLock(Path(sys.argv[1])); "
         "print('locked', flush=True); time.sleep(120)", str(folder)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=rf"another sweep driver is running in this folder "
                                              rf"\(pid {holder.pid} on {socket.gethostname()}\)"):
            DriverLock(folder)
        holder.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel drops the lock
        holder.wait(timeout=30)
    finally:
        holder.kill()
    time.sleep(0.1)
    lock = DriverLock(folder)
    assert (folder / LOCK_FILE).read_text().split()[0] != str(holder.pid)
    lock.release()
    DriverLock(folder).release()  # released: the next driver takes it


def test_a_used_folder_takes_only_resume_with_its_own_settings(tmp_path):
    data = tmp_path / "data"

    def claim(*argv):
        """The sweep state a driver run with TWO and `argv` claims (resume files checked)."""
        return claim_state(sweep_plan(BASE2NOVEL, tmp_path, [*TWO, *argv], data=data),
                           check_resume_files)

    state = claim()
    state.update(parent_run_id="abc")
    with pytest.raises(ConfigError, match=r"holds the sweep 'base2novel' already .*--resume"):
        claim()
    resumed = claim("--resume")
    assert resumed.data["parent_run_id"] == "abc"
    with pytest.raises(ConfigError, match=r"--resume: .* \(--trials 2 -> 3\)"):
        claim("--resume", "--trials", "3")
    with pytest.raises(ConfigError, match=r"--datasets eurosat,dtd -> eurosat"):
        claim("--resume", "--datasets", "eurosat")
    with pytest.raises(ConfigError, match=r"dtd config loss.gamma; eurosat config loss.gamma|"
                                          r"eurosat config loss.gamma; dtd config loss.gamma"):
        claim("--resume", "--set", "loss.gamma=2")
    with pytest.raises(ConfigError, match=r"search range loss.beta"):
        claim("--resume", "--range", "loss.beta=log:0.5:2")
    # a key --set fixes is out of the recorded space: the Optuna study holds no param for it
    with pytest.raises(ConfigError, match=r"config loss.beta.*search range loss.beta"):
        claim("--resume", "--set", "loss.beta=0.5")
    with pytest.raises(ConfigError, match=r"--free-running not set -> set"):
        claim("--resume", "--free-running")
    # resources do not change results: a resume may place the runs differently
    claim("--resume", "--cpus-per-worker", "2")
    # a new sweep under another name has a folder of its own
    second = claim("--name", "second")
    assert second.data.get("parent_run_id") is None
    # a rehearsal never continues a real sweep, nor a real sweep a rehearsal
    with pytest.raises(ConfigError, match=r"^--resume --rehearse: sweep 'base2novel' in .* is a "
                                          r"real sweep; a rehearsal never continues one"):
        claim("--resume", "--rehearse", "10")
    claim("--name", "dry", "--rehearse", "10")
    claim("--name", "dry", "--resume", "--rehearse", "20")  # another time scale: the same one
    with pytest.raises(ConfigError, match=r"^--resume: sweep 'dry' in .* is a rehearsal; "
                                          r"continue it with --rehearse"):
        claim("--name", "dry", "--resume")


def test_the_trials_at_once_are_fixed_at_the_start_and_kept_by_resume(tmp_path):
    """Without --concurrent-trials the cluster chooses how many trials of a dataset run at once
    (N), and the table depends on N: the first start records it, --resume takes the recorded N
    on any cluster that holds N trials, and a cluster that holds fewer is refused in one line."""
    from vacsr.sweep.plan.ownership import fixed_concurrency

    def plan(*argv):
        built = sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "eurosat", "--trials", "8",
                                                  *argv], data=tmp_path / "data")
        built.configs["eurosat"].train.gpus_per_worker = 1.0  # a GPU a trial
        return built

    first = plan()
    state = claim_state(first, check_resume_files)
    assert first.concurrent_trials is None
    fixed = fixed_concurrency(first, state, {"CPU": 64, "GPU": 6})
    assert fixed.concurrent_trials == 6 and state.data["concurrent_trials"] == 6
    resumed = claim_state(plan("--resume"), check_resume_files)
    assert fixed_concurrency(plan("--resume"), resumed, {"CPU": 64, "GPU": 16}) \
        .concurrent_trials == 6  # a larger cluster: the recorded N
    with pytest.raises(ConfigError, match=r"^--resume: the sweep runs 6 trials of a dataset at "
                                          r"once \(fixed at its start\), and this cluster holds "
                                          r"4; resume it on a cluster that holds 6$"):
        fixed_concurrency(plan("--resume"), resumed, {"CPU": 64, "GPU": 4})
    # asked for more than the cluster holds: refused, not run with fewer (another table)
    other = plan("--name", "other", "--concurrent-trials", "8")
    with pytest.raises(ConfigError, match=r"^--concurrent-trials 8: this cluster holds 6 trials "
                                          r"at once"):
        fixed_concurrency(other, claim_state(other, check_resume_files), {"CPU": 64, "GPU": 6})
