"""Adding a method that reuses the towers' hooks (vacsr/model/tower_hooks.py) stays one module and
one registry line: a toy deep method, a learned shift of the tokens leaving each tower's last
block, declared as a method module would declare it (here, in this file) and registered by its
line in the registry's table, trains, keeps CLIP frozen, and its checkpoint evaluates as its run
did through `vacsr eval`, with nothing else of vacsr changed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from vacsr.cli import main
from vacsr.config import load_config
from vacsr.methods import registry
from vacsr.methods.method import FROZEN_CLIP, SHARED_KEYS, Method, cross_entropy
from vacsr.model.clip_heads import CosineHead, clip_logit_scale
from vacsr.model.prefix import blocks
from vacsr.model.tower_hooks import TowerHooks
from vacsr.train.checkpoint import load_checkpoint
from vacsr.train.loop import Trainer, train

pytestmark = pytest.mark.timeout(300)


# ---------------------------------------------------------------- the module a method would be
class ShiftHead(CosineHead):
    """exp(t) cos(v, w) of towers whose last block's tokens are shifted by a learned vector."""

    def __init__(self, *, logit_scale: float, widths: dict[str, int], last: dict[str, int]):
        super().__init__(logit_scale=logit_scale)
        self.shift = nn.ParameterDict({t: nn.Parameter(torch.zeros(w)) for t, w in widths.items()})
        self.last = last

    def tower_hooks(self) -> dict[str, TowerHooks]:
        return {t: TowerHooks(after={self.last[t]: lambda x, t=t: x + self.shift[t]})
                for t in self.shift}


def build_head(adapter, backbone):
    towers = {t: blocks(backbone.clip, t) for t in ("image", "text")}
    return ShiftHead(logit_scale=clip_logit_scale(backbone),
                     widths={t: b[0].ln_1.normalized_shape[0] for t, b in towers.items()},
                     last={t: len(b) - 1 for t, b in towers.items()})


METHOD = Method(
    name="toy_shift", cites="a test of the hook mechanism", trains="a shift per tower",
    build_head=build_head, loss=cross_entropy, kind_keys=SHARED_KEYS,
    protocol={k: v for k, v in FROZEN_CLIP.items() if k != "data.augment"},
    tasks=("classification",), hooked_blocks=lambda values: 1)


# ---------------------------------------------------------------- the test
@pytest.fixture
def registered(monkeypatch):
    """The module's line in the registry's table."""
    monkeypatch.setitem(registry.METHODS, METHOD.name, METHOD)


def test_a_deep_method_is_one_module_and_one_registry_line(registered, tmp_path, weights):
    from vacsr.data.generate import generate_all

    root = generate_all(tmp_path / "data", datasets=["eurosat"], per_class=(4, 3, 4))
    out = tmp_path / "run"
    config = load_config(overrides=[
        f"model.pretrained={weights}", f"train.output_dir={out}", "train.progress=false",
        "train.device=cpu", "data.task=classification", "data.dataset=eurosat",
        f"data.root={root}", "data.shots=2", "data.augment=false", "train.batch_size=4",
        "train.epochs=1", "optim.lr=0.05", "adapter.kind=toy_shift",
        *(f"{k}={str(v).lower()}" for k, v in METHOD.protocol.items())])
    built = Trainer(config)
    assert set(built.model.backbone.hooks) == {"image", "text"}
    assert built.model.backbone.frozen_depth("image") == 2  # blocks 0-1 of 3: the prefix
    before = {k: v.clone() for k, v in built.model.state_dict().items()}
    result = train(config)
    after = load_checkpoint(result.checkpoint)["model"]
    moved = {k for k in after if not torch.equal(after[k], before[k])}
    assert moved == {"head.shift.image", "head.shift.text"}, moved  # CLIP stays frozen
    report = Path(tmp_path / "eval.json")
    assert main(["eval", "--checkpoint", str(result.checkpoint), "--out", str(report)]) == 0
    assert json.loads(report.read_text())["metrics"]["acc"] == result.final_metrics["test/acc"]
