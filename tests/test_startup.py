"""A Ray Train run's start-up: what the Tune trial actor and the Train controller load, and the
file through which a trial's reports reach Tune (benchmarks/bench_startup.py measures the costs)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from vacsr.sweep.trial import FileReports, ReportReader, fit_reporting

MODEL_STACK = ("torch", "torchvision", "timm", "open_clip", "vacsr.train.loop")

# What a trial actor does (build the trainer), then what its Train controller receives: the
# pickled callbacks and run context, loaded in a fresh process as Ray would load them there.
CONTROLLER_VIEW = """
import json, os, subprocess, sys
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
import ray.cloudpickle as pickle
from vacsr.config import load_config
from vacsr.distributed.train import build_torch_trainer
import vacsr.sweep.trial
trainer = build_torch_trainer(load_config(overrides=["train.output_dir=OUT"]))
blob = pickle.dumps({"callbacks": trainer._create_default_callbacks(),
                     "context": trainer.train_run_context, "train_fn": trainer._get_train_func()})
loaded = [m for m in MODULES if m in sys.modules]
code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); "
code += "print([m for m in MODULES if m in sys.modules])"
out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, check=True)
print(json.dumps({"trial actor": loaded, "controller": out.stdout.decode().strip(),
                  "callbacks": [type(c).__name__ for c in trainer._create_default_callbacks()]}))
"""


def test_trial_actor_and_controller_load_no_model_stack(tmp_path):
    """torch and the model stack load on the Train workers only (about 2 CPU-s per process),
    and no DatasetManager actor is started for a run without Ray Datasets."""
    code = CONTROLLER_VIEW.replace("OUT", str(tmp_path)).replace("MODULES", repr(MODEL_STACK))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["trial actor"] == [] and seen["controller"] == "[]", seen
    assert "DatasetsCallback" not in seen["callbacks"]
    assert "BackendSetupCallback" in seen["callbacks"]


def test_report_reader_takes_complete_lines_in_order(tmp_path):
    path = tmp_path / "reports.jsonl"
    path.write_text('{"epoch": 1}\n{"epoch": 2, "val/acc": NaN}\n{"epo')
    reader = ReportReader(path)
    first = reader.new()
    assert [r["epoch"] for r in first] == [1, 2] and first[1]["val/acc"] != first[1]["val/acc"]
    with open(path, "a") as out:
        out.write('ch": 3}\n')
    assert reader.new() == [{"epoch": 3}] and reader.new() == []


class _Run:
    """A Train run that reports through FileReports (as its controller would), then fails."""

    def __init__(self, callback: FileReports, error: Exception | None) -> None:
        self.callback, self.error = callback, error

    def fit(self) -> None:
        for epoch in (1, 2, 3):
            checkpoint = type("Checkpoint", (), {"path": f"/ckpt/{epoch}"})()
            self.callback.after_report(None, [{"epoch": epoch}], checkpoint)
        if self.error:
            raise self.error


@pytest.mark.parametrize("error", [None, RuntimeError("worker group failed")])
def test_every_report_reaches_tune_in_order_before_the_runs_error(tmp_path, monkeypatch, error):
    import ray

    import vacsr.sweep.trial as trial

    monkeypatch.setattr(ray, "get_runtime_context", lambda: type(
        "Context", (), {"get_node_id": lambda self: "node"})())
    reported = []
    monkeypatch.setattr(trial.tune, "report", reported.append)
    path = tmp_path / "reports.jsonl"
    path.touch()
    run = _Run(FileReports(path), error)
    if error:
        with pytest.raises(RuntimeError, match="worker group failed"):
            fit_reporting(run, ReportReader(path), poll_s=0.01)
    else:
        fit_reporting(run, ReportReader(path), poll_s=0.01)
    assert reported == [{"epoch": e, "checkpoint_path": f"/ckpt/{e}"} for e in (1, 2, 3)]
    assert json.loads(path.read_text().splitlines()[0]) == reported[0]
