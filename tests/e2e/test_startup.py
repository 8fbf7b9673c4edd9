"""A Ray Train run's driver side (the Tune trial actor, `vacsr train --ray`) builds its trainer
without the model stack, which only the Train workers load (benchmarks/bench_startup.py measures
the start-up)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray_api

MODEL_STACK = ("torchvision", "timm", "open_clip", "vacsr.train.loop", "vacsr.model.vacsr",
               "mlflow")

TRIAL_SIDE = """
import json, sys
from vacsr.config import load_config
from vacsr.distributed.train import build_torch_trainer
import vacsr.sweep.search.trial
trainer = build_torch_trainer(load_config(overrides=["train.output_dir=OUT", "train.workers=2"]))
print(json.dumps({"loaded": [m for m in MODULES if m in sys.modules],
                  "trainer": type(trainer).__module__ + "." + type(trainer).__name__}))
"""


def test_the_trial_side_builds_ray_s_torch_trainer_without_the_model_stack(tmp_path):
    code = TRIAL_SIDE.replace("OUT", str(tmp_path)).replace("MODULES", repr(MODEL_STACK))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["loaded"] == [], seen
    assert seen["trainer"].endswith(".TorchTrainer") and seen["trainer"].startswith("ray.train")


DATASET_SIDE = """
import json, sys
from vacsr.config import load_config
from vacsr.records.inputs import fingerprints
config = load_config(overrides=["data.task=classification", "data.dataset=eurosat",
                                "data.root=ROOT", "data.shots=2"])
prints = fingerprints(config.data, 1)
print(json.dumps({"loaded": [m for m in MODULES if m in sys.modules],
                  "splits": [p.split for p in prints]}))
"""


def test_a_dataset_task_fingerprints_its_data_without_the_model_stack(tmp_path):
    """The splits a sweep's dataset task logs as MLflow dataset inputs (vacsr/records/inputs.py)
    are built by the data layer alone: no open_clip, nor the torchvision it brings."""
    from vacsr.data.generate import generate_all

    root = generate_all(tmp_path / "data", datasets=["eurosat"], per_class=(2, 1, 1))
    modules = tuple(m for m in MODEL_STACK if m != "mlflow")  # which logs them, elsewhere
    code = DATASET_SIDE.replace("ROOT", str(root)).replace("MODULES", repr(modules))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"loaded": [], "splits": ["train", "val", "test"]}, seen


DATASET_TASK = """
import json, sys
import vacsr.sweep.flow.dataset_task
from vacsr.records.inputs import log_dataset_inputs
from vacsr.sweep.final.seeds import final_runs
from vacsr.sweep.search.tune import search_dataset
from vacsr.distributed.pool_scorer import PoolScorer
print(json.dumps([m for m in ("torch", "open_clip", "ray.train.torch", "matplotlib")
                  if m in sys.modules]))
"""


def test_a_sweep_dataset_task_imports_no_torch():
    """What a sweep dataset's task imports (vacsr/sweep/flow/dataset_task.py) brings no torch:
    its trials train in Tune's actors and its final checkpoints are encoded and scored on the
    evaluation actors, which send back their metrics (PoolScorer.evaluate). Nor matplotlib:
    only a process that draws a run's curves or the report's figures loads it."""
    out = subprocess.run([sys.executable, "-c", DATASET_TASK], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
