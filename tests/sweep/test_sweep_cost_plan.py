"""`--plan`: the counts a run reads, ASHA's expected stopping, the memory refusal before any
trial (its bounding key and figures), the ETA from the estimate, a real plan (local Ray
calibration) that writes nothing and prints only vacsr's lines, and a second plan that reuses the
costs the first measured."""
from __future__ import annotations

import dataclasses
import io
import json
import re

import pytest

from conftest import nothing_written, one_line
from sweeps.base2novel import SWEEP as BASE2NOVEL
from sweeps.domain_generalization import SWEEP as DOMAIN_GENERALIZATION
from vacsr.data.classification import load_classification
from vacsr.data.generate import generate_all, write_samples
from vacsr.data.synthetic_layout import SyntheticSizes
from vacsr.sweep.cli import main
from vacsr.sweep.cost import estimate
from vacsr.sweep.cost.cost_key import sample_shapes
from vacsr.sweep.cost.counts import SAMPLES, count_dataset, synthetic_counts
from vacsr.sweep.report.progress import SweepProgress


def _tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("kind, dataset, imagenet_classes", [
    (BASE2NOVEL, "dtd", 1000), (BASE2NOVEL, "imagenet", 1000), (BASE2NOVEL, "imagenet", 30),
    (BASE2NOVEL, "fgvc_aircraft", 1000), (BASE2NOVEL, "caltech101", 1000),
    (DOMAIN_GENERALIZATION, "imagenet", 1000), (DOMAIN_GENERALIZATION, "imagenet", 30)])
def test_counts_are_what_a_run_loads_and_counting_writes_nothing(tmp_path, monkeypatch, kind,
                                                                 dataset, imagenet_classes):
    """Counted from the files, and computed from the generator's sizes without them (a --plan
    of the embedded profile): the same numbers, and sample images of the same format and size
    (what the kept costs are keyed by); for ImageNet-1k and for a smaller ImageNet (its prompts
    are its classes, not ImageNet-1k's)."""
    sizes = SyntheticSizes(per_class=(5, 3, 2), imagenet_classes=imagenet_classes)
    root = generate_all(tmp_path / "data", datasets=kind.data_needed([dataset]),
                        per_class=sizes.per_class, imagenet_classes=imagenet_classes)
    monkeypatch.setenv("VACSR_CACHE_DIR", str(tmp_path / "cache"))
    before = _tree(tmp_path)
    counts = count_dataset(kind, root, dataset, shots=4)
    assert _tree(tmp_path) == before  # no few-shot split, no listing cache
    computed = synthetic_counts(kind, dataset, 4, sizes)
    assert dataclasses.replace(counts, samples=()) == computed
    samples = write_samples(tmp_path / "samples", dataset, SAMPLES)
    assert sample_shapes(samples) == sample_shapes(counts.samples)
    assert len(counts.samples) == SAMPLES
    subsample = kind.train_classes
    run = load_classification(root, dataset, shots=4, seed=1, subsample=subsample)
    assert (counts.train, counts.val, counts.test) == tuple(
        len(run[split].labels) for split in ("train", "val", "test"))
    assert counts.prompts == len(run["train"].classnames)
    if kind is BASE2NOVEL:
        novel = load_classification(root, dataset, shots=4, seed=1, subsample="novel")
        assert counts.evaluations == {"novel_acc": len(novel["test"].labels)}
    else:
        assert counts.evaluations == {
            f"{shift}_acc": len(load_classification(root, shift, shots=4, seed=1)["test"].labels)
            for shift in ("imagenetv2", "imagenet_sketch", "imagenet_a", "imagenet_r")}


def test_asha_expectation_follows_rays_cutoff():
    first, second = estimate.asha_epochs([(8,), (8,)], 8)
    assert first == 8  # the first trial meets no cutoff
    # the second stops at epoch 1 when below the first (half the time), else runs all 8
    assert second == pytest.approx(0.5 * 1 + 0.5 * 8, abs=0.25)
    many = estimate.asha_epochs([(8,)] * 24, 8)
    assert many[-1] < 3.0  # late trials mostly stop at the first rung


def test_a_batch_size_that_cannot_fit_is_refused_before_any_trial(tmp_path, capsys):
    storage = tmp_path / "sweeps"
    line = one_line(["--datasets", "dtd,eurosat", "--range", "train.batch_size=choice:8,4096",
                     "--device-memory-gib", "0.25", "--storage", storage], capsys,
                    entry=lambda argv: main(BASE2NOVEL, argv))
    assert "dtd: train.batch_size=4096 needs an estimated" in line and "0.25 GiB" in line
    nothing_written(storage)


def test_the_bounding_key_is_the_searched_key_that_lowers_the_peak_most(tmp_path, capsys):
    """Batch size fixed, the image blocks searched: the blocks bound the peak, named with the
    flag that narrows them; figures at the digits that show the comparison."""
    line = one_line(["--datasets", "dtd", "--set", "train.batch_size=512", "--range",
                     "model.trainable_image_blocks=choice:0,-1", "--device-memory-gib", "0.01",
                     "--storage", tmp_path / "sweeps"], capsys,
                    entry=lambda argv: main(BASE2NOVEL, argv))
    assert "dtd: model.trainable_image_blocks=-1 needs an estimated" in line, line
    assert "--range model.trainable_image_blocks=choice:" in line
    nothing_written(tmp_path / "sweeps")


def test_a_tiny_device_memory_is_refused_with_figures_that_compare(tmp_path, capsys):
    from sweeps.retrieval import SWEEP as RETRIEVAL

    line = one_line(["--plan", "--device-memory-gib", "0.001", "--storage", tmp_path / "s"],
                    capsys, entry=lambda argv: main(RETRIEVAL, argv))
    need, have = re.search(r"needs an estimated ([0-9.e-]+) GiB .* device's ([0-9.e-]+) GiB",
                           line).groups()
    assert float(need) > float(have) == 0.001, line  # not "0.0 GiB ... more than 0.001 GiB"
    nothing_written(tmp_path / "s")


def test_plan_refuses_more_trials_at_once_than_the_machine_holds_before_measuring(
        tmp_path, capsys):
    """--plan with a --concurrent-trials the sweep would refuse: the same line, before any
    calibration starts Ray, and nothing written (the table depends on N: no quiet lowering)."""
    line = one_line(["--plan", "--concurrent-trials", "999", "--datasets", "dtd", "--storage",
                     tmp_path / "s"], capsys, entry=lambda argv: main(BASE2NOVEL, argv))
    assert line.startswith("vacsr: error: --concurrent-trials 999: this cluster holds "), line
    assert "the table depends on the number" in line
    nothing_written(tmp_path / "s")


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-1", "abc"])
def test_a_device_memory_that_is_not_a_finite_positive_number_is_one_line(tmp_path, capsys,
                                                                        value):
    line = one_line(["--plan", f"--device-memory-gib={value}", "--storage", tmp_path / "s"],
                    capsys, entry=lambda argv: main(BASE2NOVEL, argv))
    assert line.startswith("vacsr: error: argument --device-memory-gib: expected a") and value \
        in line


def test_the_eta_starts_from_the_plan_and_follows_measured_trials():
    stream = io.StringIO()
    progress = SweepProgress("demo", ["dtd", "eurosat"], 2, [], "val/acc", stream=stream,
                             interval_s=0.0, unit_costs={"dtd": (30.0, 0.0),
                                                         "eurosat": (30.0, 0.0)})
    progress.tick()
    assert "0/4 trials, ETA 2 min 00 s" in stream.getvalue()  # 4 trials x 30 s, nothing run
    progress.start -= 60.0  # one trial done after 60 s, twice the plan's 30 s
    progress.event({"dataset": "dtd", "event": "trial", "status": "TERMINATED", "epochs": 1,
                    "value": 50.0})
    # 90 s of the plan's 120 left, a quarter passed at half speed: 90 x (3/4 + 1/4 x 2)
    assert "1/4 trials, ETA 1 min 52 s" in stream.getvalue().splitlines()[-1]


def test_without_the_plan_the_eta_is_the_measured_pace():
    stream = io.StringIO()
    progress = SweepProgress("demo", ["dtd"], 3, [], "val/acc", stream=stream, interval_s=0.0)
    progress.tick()
    assert "0/3 trials, ETA -" in stream.getvalue()
    progress.start -= 40.0
    progress.event({"dataset": "dtd", "event": "trial", "status": "TERMINATED", "epochs": 1,
                    "value": 50.0})
    assert "1/3 trials, ETA 1 min 20 s" in stream.getvalue().splitlines()[-1]  # 2 x 40 s


def test_the_eta_of_a_long_unit_left_alone_is_its_own_length():
    """ImageNet's trials are ten times dtd's: once dtd is done, ImageNet's rest is the ETA,
    not the sweep's mean pace per trial times the trials left (found by a rehearsal of the 11
    datasets: ETA 14 s with ten minutes of ImageNet to go)."""
    stream = io.StringIO()
    # 2 lanes; a trial and the final seeds: dtd 10 s and 10 s, imagenet 100 s and 100 s
    progress = SweepProgress("demo", ["dtd", "imagenet"], 2, [], "val/acc", stream=stream,
                             interval_s=0.0,
                             unit_costs={"dtd": (10.0, 10.0), "imagenet": (100.0, 100.0)},
                             lanes=2)
    progress.tick()  # imagenet's 2 x 100 + 100 is longer than both units' 330 over 2 lanes
    assert "0/4 trials, ETA 5 min 00 s" in stream.getvalue()
    for _ in range(2):
        progress.event({"dataset": "dtd", "event": "trial", "status": "TERMINATED",
                        "epochs": 1, "value": 50.0})
    progress.finished("dtd")
    progress.tick()
    assert "2/4 trials, ETA 5 min 00 s" in stream.getvalue().splitlines()[-1]  # not 2 x 55 s
    progress.start -= 200.0  # imagenet's first trial took 200 s, twice the plan's 100
    progress.event({"dataset": "imagenet", "event": "trial", "status": "TERMINATED",
                    "epochs": 1, "value": 50.0})
    # 200 s of the plan's 300 left; 100 of them passed at half speed: 200 x (2/3 + 1/3 x 2)
    assert "3/4 trials, ETA 4 min 26 s" in stream.getvalue().splitlines()[-1]


@pytest.mark.timeout(300)
def test_plan_on_the_embedded_profile_prints_every_dataset_and_writes_nothing(tmp_path, capsys):
    storage, out = tmp_path / "sweeps", tmp_path / "plan.json"
    code = main(BASE2NOVEL, ["--plan", "--datasets", "dtd,eurosat", "--storage", str(storage),
                             "--plan-out", str(out)])
    captured = capsys.readouterr()
    printed = captured.out
    assert code == 0, printed
    nothing_written(storage)
    plan = json.loads(out.read_text())
    rows = {r["dataset"]: r for r in plan["datasets"]}
    assert set(rows) == {"dtd", "eurosat"} and plan["measured_on"]["device"].startswith("cpu")
    # the embedded profile writes 4 train and 3 val images of each of DTD's 47 classes: 24 base
    assert (rows["dtd"]["train"], rows["dtd"]["val"], rows["dtd"]["prompts"]) == (48, 48, 24)
    assert rows["dtd"]["search_s"] <= rows["dtd"]["search_no_stop_s"]
    assert plan["totals"]["search_device_s"] > 0 and "dtd" in printed and "eurosat" in printed
    # only vacsr's lines (Ray's token notice and the like go to its log), in units that read
    assert "WARNING" not in printed + captured.err and captured.err == ""
    totals = printed.splitlines()[-4:-1]
    assert re.fullmatch(r"search (\d+ s|\d+ min \d\d s|\d+ h \d\d min) of device time .*",
                        totals[0]), totals
    assert re.fullmatch(r"wall time (\d+ s|\d+ min \d\d s) \(at most .*\)", totals[1]), totals
    # two datasets at 0.5 CPU a trial on 2 CPUs: the default gives each 2 trials at once
    assert "2 dataset(s) at a time, 2 trial(s) each (of 4 trial slots; the table depends on " \
        "the trials at once), on 2 CPU" in printed
    assert totals[2] == ("busy: search 2 of 2 CPU(s) (100%); final seeds 1 of 2 CPU(s) (50%), "
                         "a unit's seeds one after another")
    assert plan["busy"] == {"resource": "CPU", "capacity": 2.0, "search": 2.0, "final": 1.0,
                            "fill": None, "fill_search": None}


@pytest.mark.timeout(300)
def test_plan_on_a_locked_used_folder_still_plans_and_changes_nothing(tmp_path, capsys):
    from vacsr.sweep.plan.ownership import DriverLock

    folder = tmp_path / "sweeps" / "base2novel"
    folder.mkdir(parents=True)
    (folder / "sweep_state.json").write_text("{}\n")  # a used folder
    lock = DriverLock(folder)  # and a driver running in it
    try:
        before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
        code = main(BASE2NOVEL, ["--plan", "--datasets", "eurosat", "--storage",
                                 str(tmp_path / "sweeps")])
        assert code == 0, capsys.readouterr().err
        assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
    finally:
        lock.release()
    assert "eurosat" in capsys.readouterr().out


def test_plan_out_in_a_missing_folder_is_one_line(tmp_path, capsys):
    line = one_line(["--plan", "--plan-out", tmp_path / "nosuch" / "plan.json", "--storage",
                     tmp_path / "sweeps"], capsys, entry=lambda argv: main(BASE2NOVEL, argv))
    assert "--plan-out" in line and "nosuch" in line
    nothing_written(tmp_path / "sweeps")


@pytest.mark.timeout(400)
def test_plan_twice_measures_once_and_a_recalibrated_run_refuses_on_what_it_measured(
        tmp_path, capsys, monkeypatch):
    """A machine cache of this test's own: the first --plan measures (a real calibration), the
    second reads what it kept, says so, and plans with the same numbers. Then a run with
    --recalibrate measures again though the costs are kept, and its own check, after the
    calibration and before the first trial, refuses against the GPU memory it measured (a CPU
    has none: the real calibration runs, and its figure is stated as a 0.25 GiB GPU's): its
    folder stays unused. Read from the cache instead, the check would have nothing to refuse."""
    import ray

    from conftest import sweep_plan
    from vacsr.errors import ConfigError
    from vacsr.sweep.cost import measure
    from vacsr.sweep.flow.driver import run_sweep
    from vacsr.sweep.plan.folders import state_file

    monkeypatch.setenv("VACSR_CACHE_DIR", str(tmp_path / "cache"))
    plans = []
    for run in range(2):
        out = tmp_path / f"plan{run}.json"
        code = main(BASE2NOVEL, ["--plan", "--datasets", "eurosat", "--storage",
                                 str(tmp_path / "sweeps"), "--plan-out", str(out)])
        printed = capsys.readouterr().out
        assert code == 0, printed
        plans.append((json.loads(out.read_text()), printed))
    (first, said_first), (second, said_second) = plans
    assert "costs: measured now on cpu" in said_first
    assert "costs: reused from the machine cache" in said_second
    assert first["costs_from"]["source"] == "measured now"
    assert second["costs_from"]["source"] == "machine cache"
    assert second["costs_from"]["seconds"] < first["costs_from"]["seconds"] / 10
    for part in ("measured_on", "datasets", "totals"):  # the estimate is the same numbers
        assert second[part] == first[part], part
    nothing_written(tmp_path / "sweeps")
    [kept] = (tmp_path / "cache" / "costs").glob("*.json")
    before = kept.read_text()

    calibrate = measure.run_calibration

    def on_a_small_gpu(*args):
        costs, resources = calibrate(*args)
        return dataclasses.replace(costs, memory_gib=0.05), resources

    monkeypatch.setattr(measure, "run_calibration", on_a_small_gpu)
    # a batch SUN397's 398 training images fill, that 0.05 GiB does not hold
    plan = sweep_plan(BASE2NOVEL, tmp_path / "sweeps", ["--datasets", "sun397", "--range",
                      "train.batch_size=choice:8,384", "--recalibrate"], monkeypatch=monkeypatch)
    try:
        with pytest.raises(ConfigError, match="sun397: train.batch_size=384 needs an estimated"):
            run_sweep(plan)
    finally:
        ray.shutdown()
    assert "costs: measured now" in capsys.readouterr().out
    assert kept.read_text() != before  # measured again and kept, not read
    assert not state_file(plan.storage).exists()  # a fixed command may start the sweep there
    assert not (plan.storage / "tune").exists()


def test_the_eta_falls_while_a_trial_runs_on_plan():
    """A running unit's current trial (then its final seeds) counts as done for the time it has
    run, up to its planned length: the ETA of a sweep on plan falls as its trials run, where it
    grew before with every minute a long trial or final phase took (seen in the ETA of a
    domain-generalisation run's CoCoOp seeds: 18 min 44 s rising to 24 min 38 s)."""
    stream, now = io.StringIO(), [1000.0]
    progress = SweepProgress("demo", ["imagenet"], 2, [], "val/acc", stream=stream,
                             interval_s=0.0, unit_costs={"imagenet": (100.0, 60.0)},
                             clock=lambda: now[0])
    progress.started("imagenet")

    def wait(seconds):
        now[0] += seconds

    wait(100.0)  # the first trial, on plan
    progress.event({"dataset": "imagenet", "event": "trial", "status": "TERMINATED",
                    "epochs": 1, "value": 50.0})
    assert "1/2 trials, ETA 2 min 40 s" in stream.getvalue().splitlines()[-1]  # 100 + 60
    wait(50.0)
    progress.tick()  # half the second trial run: 50 + 60 left, at the plan's speed
    assert "1/2 trials, ETA 1 min 50 s" in stream.getvalue().splitlines()[-1]
    wait(50.0)
    progress.event({"dataset": "imagenet", "event": "trial", "status": "TERMINATED",
                    "epochs": 1, "value": 50.0})
    wait(30.0)
    progress.tick()  # half the final seeds' 60 s
    assert "2/2 trials, ETA 0 min 30 s" in stream.getvalue().splitlines()[-1]
    wait(60.0)
    progress.tick()  # the seeds overrun their plan by 30 s: the rest is nothing planned
    assert "2/2 trials, ETA 0 min 00 s" in stream.getvalue().splitlines()[-1]
