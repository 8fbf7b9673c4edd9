"""train.device: one parser, one machine check, one line on bad input; the process-group backend
and the Ray worker's device are functions of the config (nccl only for CUDA workers)."""
from __future__ import annotations

import pytest
import torch

from conftest import one_line
from vacsr.compute_device import (
    DeviceSpec,
    parse_device,
    process_group_backend,
    ray_worker_device,
    resolve_device,
)
from vacsr.config import load_config
from vacsr.errors import ConfigError

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


@pytest.mark.parametrize("text, spec", [("auto", DeviceSpec("auto")), ("cpu", DeviceSpec("cpu")),
                                        ("cuda", DeviceSpec("cuda")),
                                        ("cuda:1", DeviceSpec("cuda", 1)),
                                        (" cuda:0 ", DeviceSpec("cuda", 0))])
def test_parse_device_reads_every_documented_form(text, spec):
    assert parse_device(text) == spec


@pytest.mark.parametrize("text", ["cuda:abc", "cuda:", "cuda:-1", "gpu", "cpu:0", "auto:1",
                                  "cuda:0:1", "CUDA", ""])
def test_parse_device_rejects_everything_else_in_one_line(text):
    with pytest.raises(ConfigError) as error:
        parse_device(text)
    message = str(error.value)
    assert message.startswith("train.device: expected auto, cpu, cuda or cuda:N")
    assert "\n" not in message


def _one_error_line(capsys, argv) -> str:
    line = one_line(argv, capsys)
    assert line.startswith("vacsr: error: train.device: "), line
    return line


def test_unparsable_device_is_one_line_before_anything_runs(capsys, tmp_path):
    err = _one_error_line(capsys, ["train", f"train.output_dir={tmp_path / 'run'}",
                                   "train.device=cuda:abc"])
    assert "'cuda:abc'" in err
    assert not (tmp_path / "run").exists()


@NO_CUDA
def test_cuda_without_a_cuda_device_is_one_line(capsys, tmp_path):
    # before this check: torch's "Found no NVIDIA driver" traceback from the first .to("cuda")
    err = _one_error_line(capsys, ["train", f"train.output_dir={tmp_path / 'run'}",
                                   "train.device=cuda", "train.epochs=1"])
    assert "torch finds no CUDA device on this machine" in err and "train.device=auto or cpu" in err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="cuda:1 asked for"):
        resolve_device("cuda:1")
    assert resolve_device("auto") == torch.device("cpu")


def test_device_strings_are_checked_by_config_validation():
    with pytest.raises(ConfigError, match="train.device: expected"):
        load_config(overrides=["train.device=cuda:x"])
    assert load_config(overrides=["train.device=cuda:3"]).train.device == "cuda:3"  # the text only


@pytest.mark.parametrize("gpus, device, backend", [
    (0.0, "auto", "gloo"), (0.0, "cpu", "gloo"),
    (1.0, "auto", "nccl"), (0.5, "cuda", "nccl"),
    (1.0, "cpu", "gloo"),  # GPUs reserved, tensors kept on the CPU (logical GPUs): no NCCL
])
def test_process_group_backend_is_nccl_only_for_cuda_workers(gpus, device, backend):
    assert process_group_backend(gpus_per_worker=gpus, device=device) == backend


def test_ray_worker_device_honours_the_cpu_override_and_refuses_what_cannot_run():
    logical_gpu = torch.device("cuda:1")  # what Ray Train assigns a worker holding GPU id 1
    assert ray_worker_device("cpu", logical_gpu) == torch.device("cpu")
    assert ray_worker_device("auto", torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ConfigError, match="no GPU is reserved"):
        ray_worker_device("cuda", torch.device("cpu"))
    with pytest.raises(ConfigError, match="names a device index"):
        ray_worker_device("cuda:0", logical_gpu)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="use train.device=cpu"):
            ray_worker_device("auto", logical_gpu)
