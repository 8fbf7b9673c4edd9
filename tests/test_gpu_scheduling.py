"""GPU scheduling on logical GPUs: a local Ray with 2 GPUs that are a resource count only
(`ray.init(num_gpus=2)`; nothing fakes CUDA), and train.device=cpu keeping the tensors on the
CPU. What this proves: Ray packs `--gpus-per-worker 0.5` trials two per GPU and runs as many at
once as the GPUs hold, gives the workers of one run distinct GPU ids and CUDA_VISIBLE_DEVICES,
and the run trains on gloo with its GPUs reserved. What only a real GPU proves: that the workers
then compute on those GPUs (NCCL, CUDA memory) - benchmarks/gpu_check.sh.
"""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from vacsr.distributed.devices import WORKERS_FILE

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1800)]

TINY = ["train.batch_size=16", "train.progress=false", "data.num_train=16", "data.num_test=8",
        "adapter.hidden_dim=16", "data.augment=false", "train.resume=false", "train.epochs=1"]


@pytest.fixture(scope="module")
def two_logical_gpus():
    import ray

    from vacsr.distributed.cluster import ensure_ray

    # four trials start eight processes at once on two cores: Ray Train's worker start timeout
    # is raised for every test in conftest.py, and the Ray processes started here inherit it
    ensure_ray(num_cpus=4, num_gpus=2, log_to_driver=False)
    assert ray.cluster_resources().get("GPU") == 2
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def random_tiny_weights(tmp_path_factory):
    """Random vacsr-tiny weights as a local file: the sweep needs no CLIP pretraining here."""
    import open_clip
    import torch

    from vacsr.model.backbone import register_model_configs

    register_model_configs()
    path = tmp_path_factory.mktemp("weights") / "tiny-random.pt"
    torch.save(open_clip.create_model("vacsr-tiny").state_dict(), path)
    return path


def _workers(folder: Path) -> list[dict]:
    return json.loads((folder / WORKERS_FILE).read_text())["workers"]


def test_two_workers_of_one_run_get_distinct_gpus(tmp_path, two_logical_gpus):
    from vacsr.cli import main

    out = tmp_path / "run"
    assert main(["train", "--ray", "--workers", "2", "train.gpus_per_worker=1",
                 "train.cpus_per_worker=0.5", "train.device=cpu", "train.max_failures=0",
                 f"train.output_dir={out}", *TINY]) == 0
    workers = sorted(_workers(out), key=lambda w: w["rank"])
    assert [w["rank"] for w in workers] == [0, 1]
    ids = [w["gpu_ids"] for w in workers]
    assert sorted(ids) == [["0"], ["1"]], ids  # one whole GPU each, not the same one
    for worker in workers:
        (gpu,) = worker["gpu_ids"]
        # Ray sets CUDA_VISIBLE_DEVICES per worker, and Ray Train's device is its GPU's index
        # in that list: what a worker on a real node would train on
        visible = worker["cuda_visible_devices"].split(",")
        assert gpu in visible and worker["ray_device"] == f"cuda:{visible.index(gpu)}"
        assert worker["device"] == "cpu"  # train.device=cpu: the tensors stayed on the CPU
    assert workers[0]["ray_device"] != workers[1]["ray_device"]
    assert (out / "last.ckpt").is_file()


class GpuUse:
    """Polls the cluster's free GPUs while a sweep runs: the most GPUs reserved at one time."""

    def __init__(self, ray, interval_s: float = 0.2):
        self.ray, self.interval_s, self.peak = ray, interval_s, 0.0
        self.total = ray.cluster_resources()["GPU"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.wait(self.interval_s):
            free = self.ray.available_resources().get("GPU", 0.0)
            self.peak = max(self.peak, self.total - free)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_half_gpu_trials_run_four_at_once_on_two_gpus(tmp_path, two_logical_gpus,
                                                      random_tiny_weights, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sweeps"))
    from base2novel import SWEEP

    from vacsr.sweep.cli import main

    argv = ["--datasets", "eurosat", "--trials", "4", "--seeds", "1", "--gpus-per-worker", "0.5",
            "--cpus-per-worker", "0.5", "--trial-cpus", "0.5", "--range", "train.epochs=choice:1",
            "--pretrained", str(random_tiny_weights), "--set", "train.device=cpu",
            "--storage", str(tmp_path), "--name", "logical"]
    with GpuUse(two_logical_gpus) as use:
        assert main(SWEEP, argv) == 0, capsys.readouterr().err[-2000:]
    # 4 trials x 1 worker x 0.5 GPU reserved together: all four ran at once
    assert use.peak == pytest.approx(2.0), use.peak
    trials = [_workers(p.parent) for p in (tmp_path / "logical").rglob(WORKERS_FILE)
              if "final" not in p.parts]
    assert len(trials) == 4, trials
    ids = sorted(w["gpu_ids"][0] for workers in trials for w in workers)
    assert ids == ["0", "0", "1", "1"], ids  # packed two per GPU
    assert all(w["device"] == "cpu" for workers in trials for w in workers)
