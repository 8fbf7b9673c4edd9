"""The bf16 path (paper C.2: mixed precision on GPU), run on the CPU through train.amp_on_cpu.

What each test proves on a CPU, and what only a GPU can: the dtype at every boundary (backbone and
GPO under autocast, adapter and losses in fp32 over the gathered batch, evaluation encoded under
autocast and scored with bf16 GEMMs), metrics close to the fp32 run, and a bf16 checkpoint
resumed exactly. torch's CPU and CUDA autocast cast the same op classes to bf16 (matmuls, linear,
convolutions) but keep different op lists, so the CUDA kernels' numbers and speed need a GPU
(benchmarks/gpu_check.sh).
"""
from __future__ import annotations

import math

import pytest
import torch

import vacsr.eval.evaluate as eval_engine
from conftest import assert_same_results
from vacsr.config import load_config
from vacsr.errors import CheckpointError
from vacsr.eval.scorer import ChunkedScorer
from vacsr.train.checkpoint import load_checkpoint
from vacsr.train.loop import Trainer
from vacsr.train.precision import run_precision

RETRIEVAL = ("data.num_train=32", "data.num_test=10", "train.batch_size=16",
             "adapter.hidden_dim=32", "data.augment=false")
CLASSIFICATION = ("data.task=classification", "data.shots=2", "model.use_gpo=false",
                  "model.trainable_image_blocks=1", "model.trainable_text_blocks=1",
                  "train.batch_size=16", "adapter.hidden_dim=32", "data.augment=false")
BF16 = ("train.amp_on_cpu=true",)


def _config(tmp_path, weights, *extra):
    return load_config(overrides=[f"model.pretrained={weights}",
                                  f"train.output_dir={tmp_path / 'run'}", "train.progress=false",
                                  "optim.lr=1e-3", "train.epochs=1", "train.resume=false",
                                  *extra])


class DtypeLog:
    """Forward hooks recording, per module and mode (train / eval), the input and output dtypes
    and whether CPU autocast was on inside it."""

    def __init__(self, model, names):
        self.seen: dict[tuple[str, str], set] = {}
        modules = dict(model.named_modules())
        for name in names:
            modules[name].register_forward_hook(self._hook(name))

    def _hook(self, name):
        def record(module, inputs, output):
            out = output if torch.is_tensor(output) else getattr(output, "logits", None)
            entry = (tuple(str(x.dtype) for x in inputs if torch.is_tensor(x)
                           and x.is_floating_point()),
                     None if out is None else str(out.dtype), torch.is_autocast_enabled("cpu"))
            mode = "train" if module.training else "eval"
            self.seen.setdefault((name, mode), set()).add(entry)
        return record

    def only(self, name, mode):
        entries = self.seen.get((name, mode))
        assert entries and len(entries) == 1, (name, mode, entries)
        return next(iter(entries))


@pytest.fixture
def scorer_dtypes(monkeypatch):
    """The GEMM dtype of every ChunkedScorer the evaluation engine builds (the real scorer runs)."""
    dtypes = []

    class Recording(ChunkedScorer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            dtypes.append(self.dtype)

    monkeypatch.setattr(eval_engine, "ChunkedScorer", Recording)
    return dtypes


def test_precision_follows_device_and_switches():
    config = load_config()
    assert run_precision("cpu", config.train).name == "fp32"  # the CPU default: measured slower
    assert run_precision("cuda", config.train).name == "bf16"  # paper C.2
    config.train.amp_on_cpu = True
    assert run_precision("cpu", config.train).name == "bf16"
    config.train.amp = False  # amp off wins everywhere, the scorer included
    assert run_precision("cpu", config.train).scorer == "fp32"
    assert run_precision("cuda", config.train).scorer == "fp32"


def _assert_finite(result):
    for entry in result.history:
        for key, value in entry.items():
            if key.startswith("train/"):
                assert math.isfinite(value), (key, value)


def test_bf16_retrieval_boundaries_and_metrics(tmp_path, tiny_weights, scorer_dtypes):
    trainer = Trainer(_config(tmp_path / "bf16", tiny_weights, *RETRIEVAL, *BF16))
    log = DtypeLog(trainer.model, ["backbone.clip.visual.conv1", "backbone.image_gpo",
                                   "backbone.text_gpo", "head"])
    gathered = []

    def gather(pairs):  # what a distributed run all-gathers: the backbone's bf16 features
        gathered.append((pairs.image_feats.dtype, pairs.text_feats.dtype))
        return pairs

    batch = next(iter(trainer.train_loader(0)))
    loss, parts = trainer.compute_loss(batch, gather, step_seed=0)
    assert gathered == [(torch.bfloat16, torch.bfloat16)]
    assert loss.dtype == torch.float32 and all(math.isfinite(float(v)) for v in parts.values())
    result = trainer.fit()
    _assert_finite(result)
    bf16, fp32 = "torch.bfloat16", "torch.float32"
    for mode in ("train", "eval"):  # training steps and the end-of-epoch evaluation
        assert log.only("backbone.clip.visual.conv1", mode) == ((fp32,), bf16, True)
        for gpo in ("backbone.image_gpo", "backbone.text_gpo"):
            inputs, output, autocast = log.only(gpo, mode)
            assert inputs == (bf16,) and output == bf16 and autocast, gpo
    # the adapter in fp32 with autocast off, in training over the gathered batch
    assert log.only("head", "train") == ((fp32, fp32), fp32, False)
    assert scorer_dtypes and set(scorer_dtypes) == {torch.bfloat16}
    assert load_checkpoint(result.checkpoint)["precision"] == "bf16"

    reference = Trainer(_config(tmp_path / "fp32", tiny_weights, *RETRIEVAL)).fit()
    assert set(scorer_dtypes[len(scorer_dtypes) // 2:]) == {torch.float32}
    _assert_close_to_fp32(result.final_metrics, reference.final_metrics)


def _assert_close_to_fp32(bf16, fp32):
    """bf16 keeps 8 significant bits: after the same steps, the loss within 2%, R@K and
    accuracy within 10 points (one query of a 10-image split) and the top-1 sigma_hat within
    0.01 of the fp32 run (measured: loss 0.03%, R@K one query at most, sigma_hat 3e-4)."""
    assert bf16["train/loss"] == pytest.approx(fp32["train/loss"], rel=0.02, abs=0.01)
    for key, value in fp32.items():
        metric = key.split("/")[-1].rsplit("_", 1)[-1]  # val/i2t_r1 -> r1, test/acc -> acc
        if key.startswith(("val/", "test/")) and metric in ("r1", "r5", "r10", "acc"):
            assert abs(bf16[key] - value) <= 10.0 + 1e-6, (key, bf16[key], value)
        if "sigma_top1" in key:  # the uncertainty of the top-1 pair, in (0, 1)
            assert abs(bf16[key] - value) <= 0.01, (key, bf16[key], value)


def test_bf16_classification_boundaries_and_metrics(tmp_path, tiny_weights, scorer_dtypes):
    trainer = Trainer(_config(tmp_path / "bf16", tiny_weights, *CLASSIFICATION, *BF16))
    log = DtypeLog(trainer.model, ["backbone.clip.visual", "backbone.clip.transformer", "head"])
    result = trainer.fit()
    _assert_finite(result)
    for mode in ("train", "eval"):
        _, output, autocast = log.only("backbone.clip.visual", mode)
        assert output == "torch.bfloat16" and autocast
    assert log.only("head", "train") == (("torch.float32", "torch.float32"), "torch.float32",
                                         False)
    assert set(scorer_dtypes) == {torch.bfloat16}
    reference = Trainer(_config(tmp_path / "fp32", tiny_weights, *CLASSIFICATION)).fit()
    _assert_close_to_fp32(result.final_metrics, reference.final_metrics)


def test_bf16_checkpoint_resumes_exactly_and_refuses_another_precision(tmp_path, tiny_weights):
    two = ("train.epochs=2", *RETRIEVAL, *BF16)
    straight = Trainer(_config(tmp_path / "a", tiny_weights, *two)).fit()
    first = Trainer(_config(tmp_path / "b", tiny_weights, *RETRIEVAL, *BF16,
                            "train.eval_test=false"))
    first.fit()  # epoch 1 of the same run, its checkpoint written in bf16
    state = load_checkpoint(first.checkpoint_path)
    assert all(t.dtype == torch.float32 for t in state["model"].values()
               if t.is_floating_point())  # autocast keeps fp32 master weights
    resumed_trainer = Trainer(_config(tmp_path / "b", tiny_weights, *two, "train.resume=true"))
    resumed = resumed_trainer.fit()
    assert resumed_trainer.start_epoch == 1
    assert_same_results(straight, resumed)
    fp32 = Trainer(_config(tmp_path / "b", tiny_weights, "train.epochs=3", *RETRIEVAL,
                           "train.resume=true"))
    with pytest.raises(CheckpointError, match="trained in bf16, this run would continue in fp32"):
        fp32.fit()
