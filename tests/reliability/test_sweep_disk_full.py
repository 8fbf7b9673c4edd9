"""A full disk stops a sweep in one line with nothing left RUNNING, Ray's state files stay whole,
and `--resume` after freeing space completes the same trials (tmpfs mounts: needs root)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO


def test_ray_storage_writes_whole_files_or_none(small_disk, tmp_path):
    """A copy onto a full disk fails and leaves the earlier file, with no temporary file."""
    import pickle

    import pyarrow.fs as pafs

    from vacsr.distributed.storage_fs import ray_storage

    disk = small_disk.mount(tmp_path / "disk", 1 << 20)
    path, filesystem = ray_storage(str(disk / "store"))
    source = tmp_path / "staging" / "exp"
    source.mkdir(parents=True)
    (source / "experiment_state.json").write_text(json.dumps({"trials": "a" * 400_000}))
    pafs.copy_files(str(source.parent), path, destination_filesystem=filesystem)
    written = disk / "store" / "exp" / "experiment_state.json"
    assert json.loads(written.read_text())["trials"] == "a" * 400_000
    (source / "experiment_state.json").write_text(json.dumps({"trials": "b" * 700_000}))
    with pytest.raises(OSError, match="No space left"):
        pafs.copy_files(str(source.parent), path, destination_filesystem=filesystem)
    assert json.loads(written.read_text())["trials"] == "a" * 400_000  # not truncated
    assert sorted(p.name for p in written.parent.iterdir()) == ["experiment_state.json"]
    assert pickle.loads(pickle.dumps(filesystem)).equals(filesystem)  # Ray ships it to workers
    assert ray_storage("s3://bucket/sweep") == ("s3://bucket/sweep", None)


def test_the_reserve_holds_room_that_a_full_disk_gives_back(small_disk, tmp_path):
    """Held, the reserve's megabytes are taken from the disk; released on a full disk, they are
    room to write again (the driver's records); held on a full disk, one StorageError line."""
    from vacsr.errors import StorageError
    from vacsr.sweep.search.recovery import SpaceReserve

    disk = small_disk.mount(tmp_path / "disk", 8 << 20)
    reserve = SpaceReserve(disk, size=2 << 20)
    reserve.hold()
    filler = small_disk.fill(disk)
    with pytest.raises(OSError):
        (disk / "record").write_bytes(bytes(1 << 20))
    reserve.release()
    (disk / "record").write_bytes(bytes(1 << 20))  # the room the reserve gave back
    with pytest.raises(StorageError) as info:
        reserve.hold()
    assert str(info.value) == (f"{disk / '.space-reserve'}: cannot write (no space left on "
                               "device); free space in the sweep folder, then run the sweep again")
    assert not (disk / ".space-reserve").exists()
    filler.unlink()
    reserve.hold()
    assert (disk / ".space-reserve").stat().st_size == 2 << 20


def test_the_reserve_writes_its_blocks_where_the_filesystem_has_no_fallocate(tmp_path,
                                                                            monkeypatch):
    """NFS answers fallocate with EOPNOTSUPP: the reserve then writes real zeros (a sparse file
    would give nothing back on a full disk)."""
    import errno

    from vacsr.sweep.search.recovery import SpaceReserve

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    reserve = SpaceReserve(tmp_path, size=(3 << 20) + 5)
    reserve.hold()
    held = tmp_path / ".space-reserve"
    assert held.stat().st_size == (3 << 20) + 5
    assert held.stat().st_blocks * 512 >= (3 << 20) + 5  # allocated, not a hole
    reserve.release()
    assert not held.exists()


def test_a_storage_failure_is_found_in_an_error_chain_or_a_remote_traceback():
    import errno

    from vacsr.sweep.search.recovery import storage_failure

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("checkpoint upload failed") from exc
    except RuntimeError as exc:
        assert storage_failure(exc) == "[Errno 28] No space left on device"
    remote = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
              "vacsr.errors.StorageError: /s/trials/e/1/failed.json: cannot write (no space left "
              "on the device); free space or choose another output folder")
    assert storage_failure(remote) == ("/s/trials/e/1/failed.json: cannot write (no space left on "
                                       "the device)")
    assert storage_failure("sqlite3.OperationalError: database or disk is full") == \
        "database or disk is full"
    assert storage_failure(ValueError("training diverged at step 3")) is None


def _driver(storage: Path, weights: Path, log: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):  # mlflow.set_tracking_uri exports it
        env.pop(name, None)
    # one trial at a time, in one reused actor (trials side by side are
    # tests/reliability/test_concurrent_sweep.py's subject, and each costs an actor's start)
    return subprocess.Popen(
        [sys.executable, "sweeps/base2novel.py", "--datasets", "eurosat", "--storage",
         str(storage), "--pretrained", str(weights), "--trials", "2", "--seeds", "1",
         "--concurrent-trials", "1", *extra],
        cwd=REPO, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def _created_trials(sweep: Path) -> dict[str, int]:
    """Tune trial id -> its creation index (the searcher's record)."""
    import optuna

    from vacsr.sweep.search.selection import creation_order

    storage = optuna.storages.RDBStorage(f"sqlite:///{sweep / 'optuna.db'}")
    try:
        return creation_order(storage, "base2novel-eurosat")
    finally:
        storage.engine.dispose()


def _open_records(sweep: Path) -> tuple[dict, list]:
    """MLflow run name -> status, and the Optuna study's trial states."""
    import optuna
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{sweep / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("vacsr-base2novel")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    study = optuna.load_study(study_name="base2novel-eurosat",
                              storage=f"sqlite:///{sweep / 'optuna.db'}")
    return runs, [t.state.name for t in study.trials]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_full_disk_stops_the_sweep_in_one_line_and_resume_completes(small_disk, tmp_path,
                                                                      weights):
    disk = small_disk.mount(tmp_path / "disk", 256 << 20)
    sweep = disk / "base2novel"
    driver = _driver(disk, weights, tmp_path / "first.log")
    trials = sweep / "trials" / "eurosat"
    deadline = time.time() + 300
    while not (trials.is_dir() and any(p.is_dir() for p in trials.iterdir())):
        assert driver.poll() is None and time.time() < deadline, \
            (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(0.2)
    filler = small_disk.fill(disk)  # a trial is training
    code = driver.wait(timeout=300)
    output = (tmp_path / "first.log").read_text()
    assert code == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    [line] = [t for t in output.splitlines() if t.startswith("vacsr:")]
    assert line.startswith(f"vacsr: error: {sweep}: the sweep stopped on a storage error ("
                           "eurosat: ") and "no space left" in line.lower(), line
    assert line.endswith("runs closed as KILLED; free space, then continue with --resume"), line
    runs, states = _open_records(sweep)  # closed in the room the driver's reserve freed
    assert runs and "RUNNING" not in {r.info.status for r in runs.values()}
    assert states and "RUNNING" not in states
    states = list((sweep / "tune").glob("eurosat-*/experiment_state-*.json"))
    assert states  # the dataset's experiment (folders.tune_experiment)
    for state in states:
        json.loads(state.read_text())  # whole: Ray wrote it through storage_fs
    started = _created_trials(sweep)

    filler.unlink()
    resumed = _driver(disk, weights, tmp_path / "resume.log", "--resume")
    code = resumed.wait(timeout=600)
    output = (tmp_path / "resume.log").read_text()
    assert code == 0 and "| eurosat |" in output, output[-3000:]
    runs, states = _open_records(sweep)
    assert "RUNNING" not in {r.info.status for r in runs.values()} and "RUNNING" not in states
    # the same trials, restored and finished: none lost, none started afresh in their place
    # (a dataset's trials run one after another: the second is created once the first ends)
    created = _created_trials(sweep)
    assert started and started.items() <= created.items() and len(created) == 2, created
    trial_runs = {n.removeprefix("eurosat-"): r for n, r in runs.items()
                  if n.removeprefix("eurosat-") in created}
    assert len(trial_runs) == len(created) == 2
    assert all("selection_val/acc" in r.data.metrics for r in trial_runs.values())
    assert runs["eurosat"].info.status == runs["base2novel"].info.status == "FINISHED"
    assert not (sweep / ".space-reserve").exists()
