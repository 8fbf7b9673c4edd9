"""A rehearsal's parts without Ray (vacsr/sweep/rehearsal/): the clock's waits are the cost
model's scaled, its curve is seeded and follows the configuration, a rehearsed run continues from
its checkpoint to what an uninterrupted one reports and imports no torch, and a rehearsal's
records are refused as results in one line. The rehearsal of a whole sweep on Ray is
tests/reliability/test_sweep_rehearsal.py."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from conftest import REPO, error_line, sweep_plan
from sweeps.base2novel import SWEEP as BASE2NOVEL
from sweeps.retrieval import SWEEP as RETRIEVAL
from vacsr.config import set_value
from vacsr.errors import CheckpointError
from vacsr.sweep.cost import estimate as est
from vacsr.sweep.cost.calibrate import StepCosts
from vacsr.sweep.cost.counts import DatasetCounts
from vacsr.sweep.rehearsal.clock import UnitClock
from vacsr.sweep.rehearsal.run import RehearsalPlace, read_checkpoint, rehearse

COSTS = StepCosts(device="cpu, 2 thread(s)", memory_gib=None, image_forward=0.01,
                  image_backward_block=0.002, text_forward=0.001, text_backward_block=0.0005,
                  head_pair=1e-5, image_load=0.003, startup=4.0)
COUNTS = DatasetCounts(train=80, val=20, test=40, prompts=5, evaluations={"novel_acc": 40})


def _clock(plan, unit: str, scale: float = 4.0) -> UnitClock:
    return UnitClock(scale=scale, unit=unit, task=plan.kind.task, costs=COSTS, counts=COUNTS,
                     depths=(2, 2), space=dict(plan.spaces[unit]), metric=plan.kind.metric)


@pytest.fixture
def plan(tmp_path, monkeypatch):
    return sweep_plan(BASE2NOVEL, tmp_path / "s", ["--datasets", "eurosat,dtd"],
                      monkeypatch=monkeypatch)


def test_the_clock_waits_the_cost_models_seconds_scaled(plan):
    config = plan.configs["eurosat"]
    clock = _clock(plan, "eurosat", scale=4.0)
    values = {k: getattr(getattr(config, k.split(".")[0]), k.split(".")[1])
              for k in est.COST_KEYS}
    run = est.RunSettings(*values.values())
    first = est.epoch_seconds(run, COSTS, COUNTS, (2, 2), cached=False) + 5 * 0.001
    later = est.epoch_seconds(run, COSTS, COUNTS, (2, 2), cached=True)
    assert clock.epoch_seconds(config, 0) == pytest.approx(first / 4)
    assert clock.epoch_seconds(config, 3) == pytest.approx(later / 4)
    # a larger batch is fewer, larger steps: the model's seconds, whatever they are
    bigger = copy.deepcopy(config)
    set_value(bigger, "train.batch_size", config.train.batch_size * 2)
    run2 = est.RunSettings(*({**values, "train.batch_size": bigger.train.batch_size}.values()))
    assert clock.epoch_seconds(bigger, 3) == pytest.approx(
        est.epoch_seconds(run2, COSTS, COUNTS, (2, 2), cached=True) / 4)


def test_the_curve_is_seeded_and_follows_the_configuration(plan):
    config = plan.configs["eurosat"]
    clock = _clock(plan, "eurosat")
    curve = [clock.val(config, e) for e in range(8)]
    assert curve == [clock.val(copy.deepcopy(config), e) for e in range(8)]  # seeded
    assert curve[-1] > curve[0]  # it learns
    other = copy.deepcopy(config)
    key = next(k for k in sorted(plan.spaces["eurosat"]) if k.startswith("loss."))
    domain = plan.spaces["eurosat"][key]
    set_value(other, key, domain.high if hasattr(domain, "high") else domain.options[-1])
    set_value(config, key, domain.low if hasattr(domain, "low") else domain.options[0])
    assert clock.quality(other) != clock.quality(config)  # the searcher has something to find
    # another unit's best points are others
    assert _clock(plan, "dtd").quality(config) != clock.quality(config)
    reseeded = copy.deepcopy(config)
    reseeded.train.seed += 1
    assert clock.val(reseeded, 7) != clock.val(config, 7)


def test_test_metrics_are_the_tasks(plan, tmp_path, monkeypatch):
    config = plan.configs["eurosat"]
    clock = _clock(plan, "eurosat")
    assert set(clock.test_metrics(config, (None, None))) == {"acc"}
    assert set(clock.test_metrics(config, (None, "novel"))) == {"acc"}
    retrieval = sweep_plan(RETRIEVAL, tmp_path / "r", [], monkeypatch=monkeypatch)
    unit = retrieval.datasets[0]
    scored = _clock(retrieval, unit).test_metrics(retrieval.configs[unit], (None, None))
    assert set(scored) == {"i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum"}
    assert scored["rsum"] == pytest.approx(sum(v for k, v in scored.items() if k != "rsum"))


class _StopAfter(RehearsalPlace):
    """The output folder's checkpoint, and a stop (as a killed process) after `epochs`."""

    def __init__(self, epochs: int | None) -> None:
        self.epochs = epochs

    def report(self, output_dir, metrics, history):
        super().report(output_dir, metrics, history)
        if self.epochs is not None and len(history) >= self.epochs:
            raise KeyboardInterrupt


def test_a_stopped_rehearsed_run_continues_to_the_uninterrupted_history(plan, tmp_path):
    config = plan.configs["eurosat"]
    config.train.epochs = 4
    clock = _clock(plan, "eurosat", scale=1e6)
    straight = copy.deepcopy(config)
    straight.train.output_dir = str(tmp_path / "straight")
    expected = rehearse(straight, clock, RehearsalPlace()).history
    config.train.output_dir = str(tmp_path / "stopped")
    with pytest.raises(KeyboardInterrupt):
        rehearse(config, clock, _StopAfter(2))
    assert len(read_checkpoint(tmp_path / "stopped" / "last.ckpt")) == 2
    resumed = rehearse(config, clock, RehearsalPlace()).history
    assert [{k: v for k, v in m.items() if k != "resumed_from_epoch"} for m in resumed] == \
        expected
    assert [m.get("resumed_from_epoch") for m in resumed] == [None, None, 2, 2]
    saved = json.loads((tmp_path / "stopped" / "metrics.json").read_text())
    assert saved["final"] == resumed[-1]
    (tmp_path / "bad.ckpt").write_bytes(b"\x80torch")
    with pytest.raises(CheckpointError, match=r"bad.ckpt: not a rehearsal's checkpoint"):
        read_checkpoint(tmp_path / "bad.ckpt")


REHEARSED_IMPORTS = """
import sys
from vacsr.sweep.rehearsal import finals, trial  # what a rehearsal's trial and seeds load
from vacsr.sweep.rehearsal.run import RehearsalPlace, rehearse
from vacsr.config import Config
from vacsr.sweep.cost.calibrate import StepCosts
from vacsr.sweep.cost.counts import DatasetCounts
from vacsr.sweep.rehearsal.clock import UnitClock

config = Config()
config.train.epochs, config.train.output_dir = 2, sys.argv[1]
costs = StepCosts("cpu", None, 0.01, 0.001, 0.001, 0.001, 0.0, 0.001, 1.0)
clock = UnitClock(1e6, "eurosat", "classification", costs, DatasetCounts(8, 4, 4, 2), (2, 2))
rehearse(config, clock, RehearsalPlace())
print(sorted(m for m in ("torch", "open_clip", "torchvision") if m in sys.modules))
"""


def test_a_rehearsed_run_imports_no_torch(tmp_path):
    out = subprocess.run([sys.executable, "-c", REHEARSED_IMPORTS, str(tmp_path / "run")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("flag, expected", [
    ("--workers", "a rehearsal rehearses runs of one worker; expected --workers 1"),
    ("--eval-actors", "a rehearsal rehearses one evaluation actor; expected --eval-actors 1")])
def test_rehearse_takes_one_worker_and_one_evaluation_actor(tmp_path, capsys, flag, expected):
    from vacsr.sweep.cli import main

    code = main(BASE2NOVEL, ["--storage", str(tmp_path), "--rehearse", "10", flag, "2"])
    line = error_line(code, capsys.readouterr().err)
    assert line == f"vacsr: error: --rehearse with {flag} 2: {expected}"
    assert not (tmp_path / "base2novel").exists()


def test_vacsr_best_refuses_a_rehearsals_records(tmp_path, capsys):
    from vacsr.cli import main
    from vacsr.records.names import REHEARSAL_TAG
    from vacsr.records.sweep_records import SweepRecords
    from vacsr.records.sweep_state import SweepState

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    state = SweepState(tmp_path / "sweep_state.json", fresh=True)
    SweepRecords(uri, "vacsr-base2novel").start_sweep_run(
        state, "dry", "base2novel", tags={REHEARSAL_TAG: "50"}).finish()
    for argv in ([], ["--sweep", "dry"], ["--table"], ["--compare"]):
        code = main(["best", "--tracking-uri", uri, *argv])
        line = error_line(code, capsys.readouterr().err)
        assert line.startswith("vacsr: error: sweep 'dry' in experiment 'vacsr-base2novel' is a "
                               "rehearsal (--rehearse 50): nothing in it trained"), argv
