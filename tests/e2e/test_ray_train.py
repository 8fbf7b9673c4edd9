"""Ray Train: W workers equal one worker, each on a GPU of its own; a killed worker resumes from its
checkpoint; a finished run started again under its name reports its final result again.

The local Ray has 2 logical GPUs, a resource count only (`ray.init(num_gpus=2)`; nothing fakes
CUDA), and train.device=cpu keeps the tensors on the CPU: what this proves is that Ray gives the
workers of one run distinct GPU ids and CUDA_VISIBLE_DEVICES and the run trains on gloo with its
GPUs reserved. That the workers then compute on those GPUs (NCCL, CUDA memory) only a real GPU
proves: benchmarks/gpu_check.sh."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vacsr.config import load_config
from vacsr.distributed.worker_gpus import read_workers
from vacsr.train.checkpoint import load_checkpoint
from vacsr.train.loop import Trainer
from vacsr.train.run_files import CHECKPOINT_FILE
from vacsr.train.run_result import TrainResult

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

BASE = ["train.batch_size=16", "train.progress=false", "data.num_train=8", "data.num_test=8",
        "adapter.hidden_dim=16", "data.augment=false", "train.resume=false"]


RAY_LOCAL = {"num_gpus": 2}  # conftest's ray_local: 2 logical GPUs beside its 2 CPUs


def _weights(path):
    return load_checkpoint(path)["model"]


def _assert_same_run(a, b):
    assert [h["epoch"] for h in a.history] == [h["epoch"] for h in b.history]
    for key, value in a.final_metrics.items():
        if not key.endswith("eval_seconds"):  # wall-clock time, not a result
            # nan = nan: a Fig. 3 correlation over too few filled bins is nan in both runs
            assert b.final_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5,
                                                         nan_ok=True), key
    wa, wb = _weights(a.checkpoint), _weights(b.checkpoint)
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-4, atol=1e-5, msg=name)


def _result_in(folder: Path) -> TrainResult:
    """What a run left in its output folder: its final checkpoint's history."""
    checkpoint = folder / CHECKPOINT_FILE
    history = list(load_checkpoint(checkpoint)["history"])
    return TrainResult(history=history, final_metrics=history[-1], checkpoint=checkpoint)


def test_two_workers_on_a_gpu_each_equal_one_worker_on_the_global_batch(tmp_path, ray_local):
    from vacsr.cli import main

    local = Trainer(load_config(overrides=BASE + ["train.epochs=2",
                                                  f"train.output_dir={tmp_path / 'local'}"])).fit()
    out = tmp_path / "ray"
    assert main(["train", "--ray", "--workers", "2", "train.gpus_per_worker=1",
                 "train.cpus_per_worker=0.5", "train.device=cpu", "train.max_failures=0",
                 "train.epochs=2", f"train.output_dir={out}", *BASE]) == 0
    distributed = _result_in(out)
    assert distributed.final_metrics["train/loss"] == pytest.approx(
        local.final_metrics["train/loss"], rel=1e-5)
    _assert_same_run(local, distributed)

    workers = sorted(read_workers(out), key=lambda w: w["rank"])
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


def test_killed_worker_resumes_and_matches_uninterrupted_run(tmp_path, ray_local, monkeypatch):
    from vacsr.distributed.train import fit_ray

    marker = tmp_path / "killed.txt"
    monkeypatch.setenv("VACSR_FAIL_ONCE", f"2:{marker}")  # killed as epoch 3 starts
    tracking = [f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "tracking.enabled=true",
                "tracking.experiment=resume-test"]
    overrides = BASE + tracking + ["train.epochs=3", "train.workers=2", "train.max_failures=1",
                                   f"train.output_dir={tmp_path / 'ray'}"]
    resumed = fit_ray(load_config(overrides=overrides))
    assert marker.exists(), "the injected failure never fired"
    # restarted from a checkpoint, not from scratch: the last one Ray Train had registered when
    # the worker died (epoch 2's report may still be in flight then, so 1 or 2)
    assert resumed.history[-1]["resumed_from_epoch"] in (1, 2)
    monkeypatch.delenv("VACSR_FAIL_ONCE")
    straight = Trainer(load_config(overrides=BASE + [
        "train.epochs=3", f"train.output_dir={tmp_path / 'local'}"])).fit()
    _assert_same_run(straight, resumed)

    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["resume-test"])
    assert len(runs) == 1, "a resumed run must keep logging to the same MLflow run"
    history = MlflowClient().get_metric_history(runs.run_id[0], "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3]  # no epoch lost or repeated

    # started again under the same name after its last epoch (a Tune trial resumed by a new sweep
    # driver): Train restores the final checkpoint, no epoch is left, and the run must still
    # report its final result with a checkpoint, or the Tune trial ends without its metric
    again = _reports(load_config(overrides=overrides), tmp_path / "again.jsonl")
    assert len(again) == 1 and again[0]["checkpoint"], "nothing reported after the restore"
    assert again[0]["metrics"] == pytest.approx(resumed.final_metrics, nan_ok=True)
    assert sorted(m.step for m in MlflowClient().get_metric_history(runs.run_id[0], "train/loss")) \
        == [1, 2, 3], "the restored run logged an epoch again"


def _reports(config, path) -> list[dict]:
    """Fit a TorchTrainer for `config`; what its workers reported, as the Train controller saw
    it."""
    import json

    from ray.train import UserCallback

    from vacsr.distributed.train import build_torch_trainer

    class Reports(UserCallback):  # runs in the Train controller: record to a file
        def after_report(self, run_context, metrics, checkpoint):
            with open(path, "a") as out:
                report = {"metrics": metrics[0], "checkpoint": bool(checkpoint)}
                out.write(json.dumps(report) + "\n")

    build_torch_trainer(config, callbacks=[Reports()]).fit()
    return [json.loads(line) for line in Path(path).read_text().splitlines()]
