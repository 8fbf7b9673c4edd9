"""Shared fixtures: seeded torch, a pretrained tiny CLIP (built once per test run, no download).

`make test` runs the suite on pytest-xdist workers (`-n 2 --dist loadgroup`). The Ray-marked tests
go in two lanes (RAY_LANES), xdist groups that run one test after another, so that each worker
runs one lane beside its share of the other tests. Two Ray instances can run at once: a local
`ray.init` takes free ports (the dashboard tries the next port when 8265 is taken) and a test's
cluster started with `ray start` names free ports for all that have fixed defaults and stops
only its own nodes (tests/test_sweep_e2e.py). Two lanes and no more: a Ray test keeps both
cores busy for long stretches, so a third at once would only slow the others.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray Train gives a worker group 60 s to start; on a loaded 2-core machine a run's processes can
# take longer, which fails the run instead of the assertion under test (Ray's processes, the
# sweeps' subprocesses included, inherit this)
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "600")
# One intra-op thread per test process: the tensors here are tiny, and a second OpenMP thread
# only spins (on 2 cores it doubled the CPU-seconds of a test and made it slower, while the
# other xdist worker's Ray processes wait for a core). Subprocesses (sweep drivers, `ray start`)
# inherit the variable; Ray's workers read it too.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


# The two lanes of Ray tests, by module, balanced by their measured time (`--durations`): about
# 6.5 minutes each when both run at once on 2 cores. A Ray test in a module not listed joins "ray-a".
RAY_LANES = {
    "ray-a": ("test_sweep_e2e.py", "test_sweep_disk_full.py", "test_sweep_kinds.py",
              "test_sweep_failures.py"),
    "ray-b": ("test_sweep_signals.py", "test_ray_train.py", "test_gpu_check.py",
              "test_secrets.py", "test_eval_actor.py"),
}
LANE_OF_MODULE = {module: lane for lane, modules in RAY_LANES.items() for module in modules}
# The tests that need the pretrained tiny CLIP run on one worker: it pretrains it (about 40 s of
# one core) while the other worker goes on with other tests instead of waiting for the file.
TINY_CLIP_GROUP = "tiny-clip"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("ray"):
            lane = LANE_OF_MODULE.get(item.path.name, "ray-a")
            item.add_marker(pytest.mark.xdist_group(lane))
        elif "tiny_weights" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group(TINY_CLIP_GROUP))


def pytest_collection_finish(session):
    """On an xdist worker under --dist loadgroup, the lane must have reached the node ids
    (`<id>@ray-a`), or two Ray tests of one lane could run at once."""
    grouped = session.config.getoption("dist", "no") == "loadgroup"
    if not (os.environ.get("PYTEST_XDIST_WORKER") and grouped):
        return
    loose = [i.nodeid for i in session.items if i.get_closest_marker("ray")
             and i.nodeid.rsplit("@", 1)[-1] not in RAY_LANES]
    if loose:
        raise pytest.UsageError(f"pytest-xdist did not group the Ray tests ({loose[0]}); "
                                "install the pytest that pyproject.toml allows")


@contextmanager
def _locked(path: Path):
    """An exclusive lock on `path` between the processes of one test run."""
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_root(tmp_path_factory) -> Path:
    """A folder of this test run that every xdist worker shares (each has a basetemp of its
    own under it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _mlflow_uri_stays_put():
    """mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI: keep it from reaching later tests
    (and their subprocesses, whose sweeps would record into another test's store)."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory):
    """The tiny CLIP pretrained contrastively on synthetic data, as a local weights file: the
    first worker to need it trains it (seeded), the others wait for it and read the same file."""
    from vacsr.model.pretrain import pretrain_clip

    root = _run_root(tmp_path_factory)
    path = root / "tiny-clip.pt"
    with _locked(root / "tiny-clip.lock"):
        if not path.is_file():
            pretrain_clip(path, progress=False)
    return path


@pytest.fixture
def read_only():
    """Make a folder read-only for real: a read-only bind mount for root (who ignores file
    modes), else chmod. Skips where neither holds."""
    import subprocess
    from pathlib import Path

    mounted, chmodded = [], []

    def apply(folder: Path) -> Path:
        if os.geteuid() == 0:
            done = subprocess.run(["mount", "--bind", str(folder), str(folder)],
                                  capture_output=True).returncode == 0
            if done:
                mounted.append(folder)
                done = subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)],
                                      capture_output=True).returncode == 0
        else:
            folder.chmod(0o555)
            chmodded.append(folder)
            done = True
        probe = folder / ".write-probe"
        try:
            probe.write_text("")
            probe.unlink()
            writable = True
        except OSError:
            writable = False
        if not done or writable:
            pytest.skip("cannot make a folder read-only here (needs root with mount, or a user)")
        return folder

    yield apply
    for folder in reversed(mounted):
        subprocess.run(["umount", str(folder)], capture_output=True)
    for folder in chmodded:
        folder.chmod(0o755)


class SmallDisk:
    """Folders on tmpfs mounts of their own, so that a test can fill a disk for real."""

    def __init__(self) -> None:
        self.mounted: list[Path] = []

    def mount(self, folder: Path, size: int) -> Path:
        """`folder` on a tmpfs of `size` bytes; skips the test where that needs what it lacks."""
        import subprocess

        folder.mkdir(parents=True, exist_ok=True)
        done = os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
            capture_output=True).returncode == 0
        if not done:
            pytest.skip("cannot mount a small tmpfs here (needs root with mount)")
        self.mounted.append(folder)
        return folder

    @staticmethod
    def fill(folder: Path) -> Path:
        """Zeros written into `folder` until its disk is full; returns the filler file."""
        filler = folder / "filler"
        with open(filler, "wb", buffering=0) as handle:
            for block in (bytes(1 << 20), bytes(4096)):  # then the last partial megabyte
                try:
                    while True:
                        handle.write(block)
                except OSError:
                    pass
        return filler


@pytest.fixture
def small_disk():
    """A SmallDisk; its mounts go at the end of the test."""
    import subprocess

    disk = SmallDisk()
    yield disk
    for folder in reversed(disk.mounted):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture(scope="session")
def weights(tmp_path_factory) -> Path:
    """Randomly initialised tiny CLIP as a local file: no download, no 'no weights' warning."""
    from vacsr.model.backbone import create_clip

    path = tmp_path_factory.mktemp("weights") / "random-tiny.pt"
    torch.save(create_clip("vacsr-tiny")[0].state_dict(), path)
    return path


def make_dataset_folders(root: Path) -> Path:
    """An empty folder for every dataset under `root`, where its layout puts it: what a sweep
    checks for before Ray starts, for the tests that only plan a sweep."""
    from vacsr.data.classification import DATASETS

    for folder in [spec.folder for spec in DATASETS.values()] + ["coco"]:
        (root / folder).mkdir(parents=True, exist_ok=True)
    return root


def one_line(argv, capsys, entry=None) -> str:
    """The one stderr line `vacsr: error: ...` of a command that must fail with exit status 2
    (`entry`: the `vacsr` command's main unless given)."""
    if entry is None:
        from vacsr.cli import main as entry
    code = entry([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("vacsr: error: "), lines
    return lines[0]


def nothing_written(folder: Path) -> None:
    assert not folder.exists() or not any(folder.rglob("*")), list(folder.rglob("*"))


@contextmanager
def http_serving(handler):
    """`handler` (an http.server handler class) on a free loopback port, in a thread, always
    shut down; yields the server's URL."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def answering(status: int, content_type: str, body: bytes):
    """An http.server handler class answering every GET with `status` and `body`."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler
