"""Shared fixtures: seeded torch, a pretrained tiny CLIP (built once per session, no download)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray Train gives a worker group 60 s to start; on a loaded 2-core machine a run's processes can
# take longer, which fails the run instead of the assertion under test (Ray's processes, the
# sweeps' subprocesses included, inherit this)
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "600")
torch.set_num_threads(min(2, os.cpu_count() or 1))


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
    """The tiny CLIP pretrained contrastively on synthetic data, as a local weights file."""
    from vacsr.model.pretrain import pretrain_clip

    path = tmp_path_factory.mktemp("weights") / "tiny-clip.pt"
    return pretrain_clip(path, progress=False)


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


@pytest.fixture(scope="session")
def weights(tmp_path_factory) -> Path:
    """Randomly initialised tiny CLIP as a local file: no download, no 'no weights' warning."""
    from vacsr.model.backbone import create_clip

    path = tmp_path_factory.mktemp("weights") / "random-tiny.pt"
    torch.save(create_clip("vacsr-tiny")[0].state_dict(), path)
    return path
