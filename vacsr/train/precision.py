"""Where a run computes in bf16 (paper appendix C.2: mixed precision on GPU).

One decision per run, from the device and two switches: `train.amp` (bf16 autocast, on by default)
and `train.amp_on_cpu` (let autocast run on a CPU as well: off by default, since on the CPUs
measured it is slower than fp32, see docs/performance.md, "Mixed precision on a CPU"; on, it runs
the GPU's bf16 path where no GPU is). Under autocast the backbone (GPO included) computes in bf16;
the adapter and the losses run in fp32 over the gathered batch (Trainer.compute_loss); evaluation
encodes under the same autocast and the scorer's GEMMs follow the run (bf16 or fp32). A checkpoint
records its precision, and a resume in another precision is refused: it would not reproduce the run
it continues.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vacsr.errors import CheckpointError

# whether `train.amp` turns autocast on, per device type; a CPU needs `train.amp_on_cpu` too
AMP_BY_DEFAULT = {"cuda": True, "cpu": False}
STATE_KEY = "precision"  # in a training checkpoint: "bf16" or "fp32"


@dataclass(frozen=True)
class Precision:
    """A run's precision on its device; calling it gives the autocast context (bf16)."""

    device_type: str
    autocast: bool

    @property
    def name(self) -> str:
        return "bf16" if self.autocast else "fp32"

    @property
    def scorer(self) -> str:
        """The ChunkedScorer precision of this run's evaluation."""
        return self.name

    def __call__(self):
        return torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.autocast)


def run_precision(device: torch.device | str, train_config) -> Precision:
    """The precision of a run of `train_config` (a TrainConfig) on `device`."""
    kind = torch.device(device).type
    on_cpu = kind == "cpu" and train_config.amp_on_cpu
    return Precision(kind, bool(train_config.amp and (AMP_BY_DEFAULT.get(kind, False) or on_cpu)))


def check_resume_precision(state: dict, precision: Precision, source) -> None:
    """Refuse to continue a checkpoint trained in another precision (one line); checkpoints
    written before precision was recorded pass."""
    stored = state.get(STATE_KEY)
    if stored is None or stored == precision.name:
        return
    raise CheckpointError(
        f"{source}: trained in {stored}, this run would continue in {precision.name} on "
        f"{precision.device_type} (train.amp, train.amp_on_cpu, train.device decide it); resume "
        f"with the precision it was trained in, or start afresh (train.resume=false)")
