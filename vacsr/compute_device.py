"""`train.device`: one parser for the text, one check against the machine.

`parse_device` reads the text alone (no torch import: config validation runs in the sweep driver
and the Tune trial actors, which never train), so a typo such as `cuda:abc` stops a run before
anything starts. `resolve_device` then asks torch whether this machine has the device, so that
`cuda` without a CUDA driver is one line instead of torch's lazy-init traceback at the first
`.to("cuda")`. Both raise ConfigError naming `train.device`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from vacsr.errors import ConfigError

KEY = "train.device"
EXPECTED = "auto, cpu, cuda or cuda:N (N a device index >= 0)"
_PATTERN = re.compile(r"(auto|cpu|cuda)(?::(\d+))?")


@dataclass(frozen=True)
class DeviceSpec:
    """A parsed device string: kind "auto" | "cpu" | "cuda", and a CUDA index where given."""

    kind: str
    index: int | None = None

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def parse_device(text: str) -> DeviceSpec:
    """`"cuda:1"` -> DeviceSpec("cuda", 1); anything else than EXPECTED raises ConfigError."""
    match = _PATTERN.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise ConfigError(f"{KEY}: expected {EXPECTED}, got {text!r}")
    index = match.group(2)
    return DeviceSpec(match.group(1), None if index is None else int(index))


def resolve_device(text: str):
    """The torch.device `text` names on this machine: auto = cuda when torch sees a CUDA device,
    else cpu. Asking for a CUDA device this machine lacks raises ConfigError (one line)."""
    import torch

    spec = parse_device(text)
    if spec.kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        built = (f"torch {torch.__version__} built for CUDA {torch.version.cuda}"
                 if torch.version.cuda else f"torch {torch.__version__} built without CUDA")
        raise ConfigError(f"{KEY}: {spec} asked for, but torch finds no CUDA device on this "
                          f"machine ({built}); use {KEY}=auto or cpu")
    count = torch.cuda.device_count()
    if spec.index is not None and spec.index >= count:
        raise ConfigError(f"{KEY}: {spec} asked for, but this machine has {count} CUDA "
                          f"device(s) (cuda:0..cuda:{count - 1})")
    return torch.device(str(spec))


def ray_worker_device(text: str, assigned):
    """The device a Ray Train worker computes on: `assigned` is the one Ray gives it
    (`ray.train.torch.get_device()`: its GPU where GPUs are reserved, else the CPU). `cpu` keeps
    the tensors on the CPU even where GPUs are reserved (logical GPUs, `ray.init(num_gpus=N)`);
    `auto` and `cuda` take Ray's GPU, which must be a real CUDA device."""
    import torch

    spec = parse_device(text)
    if spec.kind == "cpu":
        return torch.device("cpu")
    if spec.index is not None:
        raise ConfigError(f"{KEY}: {spec} names a device index, but under Ray each worker trains "
                          f"on the GPU Ray assigns it; use {KEY}=auto or cuda")
    if assigned.type != "cuda":
        if spec.kind == "cuda":
            raise ConfigError(f"{KEY}: cuda asked for, but no GPU is reserved for the Ray "
                              f"workers; set train.gpus_per_worker > 0 (--gpus-per-worker)")
        return assigned
    if not torch.cuda.is_available():
        raise ConfigError(f"{KEY}: Ray reserved a GPU for this worker, but torch finds no CUDA "
                          f"device on its node; use {KEY}=cpu to train on the CPU with the GPUs "
                          f"reserved (logical GPUs), or a node whose torch sees its GPUs")
    return assigned


def process_group_backend(*, gpus_per_worker: float, device: str) -> str:
    """torch.distributed backend of a Ray Train run: nccl where its workers compute on CUDA (GPUs
    reserved and train.device not cpu), gloo otherwise. NCCL only runs on CUDA tensors, and a
    process group is set up before the workers' code runs, so the choice is made from the config:
    the driver need not be on a GPU node."""
    spec = parse_device(device)
    return "nccl" if gpus_per_worker > 0 and spec.kind != "cpu" else "gloo"
