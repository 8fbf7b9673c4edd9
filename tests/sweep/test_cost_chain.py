"""The cost estimate's arithmetic (vacsr/sweep/cost/), each function against a hand-computed
example: two datasets, three trials, two batch sizes, made-up per-input costs. Every expected
figure is worked out in the comments, so a reader can check it with a pencil."""
from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from sweeps.base2novel import SWEEP as BASE2NOVEL
from vacsr.config import from_dict
from vacsr.sweep.cost import estimate as est
from vacsr.sweep.cost.calibrate import StepCosts
from vacsr.sweep.cost.counts import DatasetCounts
from vacsr.sweep.cost.memory import comparable
from vacsr.sweep.cost.sweep_cost import (
    build_sweep_cost,
    dataset_estimate,
    duration,
    sharing,
    wall_seconds,
)
from vacsr.sweep.plan.plan import SweepPlan
from vacsr.sweep.spec.schedule import ASHA
from vacsr.sweep.spec.space import Choice

# seconds per input: load + forward of an image = 0.015, a trainable image block's backward 0.002
COSTS = StepCosts(device="cpu, 1 thread(s)", memory_gib=None, image_forward=0.009,
                  image_backward_block=0.002, text_forward=0.001, text_backward_block=0.0005,
                  head_pair=0.0001, image_load=0.006, startup=2.0, teardown=1.0)
DEPTHS = (3, 3)  # vacsr-tiny's towers
# dtd: 44 training images (11 steps of 4, 5 of 8: the last partial batch dropped), 5 prompts
DTD = DatasetCounts(train=44, val=10, test=20, prompts=5, evaluations={"novel_acc": 30})
EUROSAT = DatasetCounts(train=20, val=5, test=10, prompts=5, evaluations={"novel_acc": 10})
LAST_ONE = est.RunSettings(batch_size=4, side="last", image_blocks=1, text_blocks=0)


def test_path_blocks_follow_the_side():
    assert est.path_blocks(0, 3, "last") == 0  # nothing trains: no backward
    assert est.path_blocks(1, 3, "last") == 1  # side last: only the trainable block
    assert est.path_blocks(1, 3, "first") == 3  # side first: from the input up
    assert est.path_blocks(-1, 3, "last") == 3 and est.path_blocks(7, 3, "last") == 3
    # in trainable blocks' worth: a frozen block the gradient crosses counts half
    assert est.backward_blocks(1, 3, "last") == 1 and est.backward_blocks(1, 3, "first") == 2
    assert est.backward_blocks(-1, 3, "first") == 3 and est.backward_blocks(0, 3, "last") == 0
    assert est.backward_blocks(1, 3, "last", first_hook=0) == 2  # hooked at block 0
    assert est.backward_blocks(0, 3, "last", path=3) == 1.5  # a prompt's way to its context


def test_step_seconds_by_hand():
    # image: 4 x (load 0.006 + forward 0.009 + 0.002 x 1 block) = 4 x 0.017 = 0.068
    # text: no text block trains: the 5 prompts are encoded once per run, not per step = 0
    # head: 0.0001 x 4 images x 5 prompts = 0.002                          -> 0.070
    assert est.step_seconds(LAST_ONE, COSTS, 5, DEPTHS) == pytest.approx(0.070)
    # side first, 1 block: the backward crosses the 2 frozen blocks above it at half a block's
    # cost each; image 4 x (0.015 + 0.002 x (1 + 2/2)) = 0.076; text 5 x (0.001 x 1 + 0.0005 x
    # 2) = 0.01; head 0.002                                                 -> 0.088
    first = est.RunSettings(4, "first", 1, 1)
    assert est.step_seconds(first, COSTS, 5, DEPTHS) == pytest.approx(0.088)
    # side last, 1 of 3 text blocks: text 5 x (0.001 x 1/3 + 0.0005 x 1) = 0.0041667
    last_text = est.RunSettings(4, "last", 1, 1)
    assert est.step_seconds(last_text, COSTS, 5, DEPTHS) == pytest.approx(0.068 + 0.005 / 1.2
                                                                          + 0.002)
    # retrieval (0 prompts): the batch's 4 captions each step, 4 x 0.001 = 0.004; head 4 x 4
    # pairs x 0.0001 = 0.0016                                              -> 0.0736
    assert est.step_seconds(LAST_ONE, COSTS, 0, DEPTHS) == pytest.approx(0.0736)


def test_epoch_and_run_seconds_by_hand():
    # 11 steps x 0.070 = 0.77; val: 10 x 0.015 + 5 prompts x 0.001 = 0.155     -> 0.925
    assert est.epoch_seconds(LAST_ONE, COSTS, DTD, DEPTHS, cached=False) == pytest.approx(0.925)
    # later epochs read the 2 frozen blocks from the cache: 10 x 0.009 x 1/3 + 0.005 = 0.035
    assert est.epoch_seconds(LAST_ONE, COSTS, DTD, DEPTHS, cached=True) == pytest.approx(0.805)
    # 2 epochs: prompts once 0.005 + 0.925 + 0.805 = 1.735; 0 epochs: nothing
    assert est.run_seconds(LAST_ONE, 2, COSTS, DTD, DEPTHS) == pytest.approx(1.735)
    assert est.run_seconds(LAST_ONE, 0, COSTS, DTD, DEPTHS) == 0.0
    # batch 8: 5 steps x 0.140 = 0.70; epochs 0.855 and 0.735; 2 epochs 1.595
    eight = est.RunSettings(8, "last", 1, 0)
    assert est.run_seconds(eight, 2, COSTS, DTD, DEPTHS) == pytest.approx(1.595)
    assert est.mean_run_seconds([LAST_ONE, eight], 2, COSTS, DTD, DEPTHS) == pytest.approx(1.665)


def test_what_a_method_runs_sets_its_step_by_hand():
    """The method's declarations (vacsr/methods/) shape the step: a frozen image tower trains on
    features computed once, a head that encodes its prompts sends them through the whole text
    tower and back every step, a method that trains nothing takes no step."""
    probe = est.RunSettings(4, "first", 0, 0, kind="linear_probe")  # frozen CLIP, blocks 0
    # no image term: the head alone, 0.0001 x 4 x 5 = 0.002; the prompts once per run
    assert est.step_seconds(probe, COSTS, 5, DEPTHS) == pytest.approx(0.002)
    # once per run: 5 prompts x 0.001 + 44 training images x (0.006 + 0.009) = 0.665
    assert est.start_seconds(probe, COSTS, DTD) == pytest.approx(0.665)
    # 11 steps x 0.002 = 0.022; val 10 x 0.015 + 0.005 = 0.155, cached after: 0.005
    # (the whole image tower is the frozen prefix); 2 epochs: 0.665 + 0.177 + 0.027 = 0.869
    assert est.run_seconds(probe, 2, COSTS, DTD, DEPTHS) == pytest.approx(0.869)
    coop = est.RunSettings(4, "first", 0, 0, kind="coop")
    # the 5 prompts x (0.001 + 0.0005 x 3 frozen blocks / 2) = 0.00875, head 0.002 -> 0.01075
    assert est.step_seconds(coop, COSTS, 5, DEPTHS) == pytest.approx(0.01075)
    zero_shot = est.RunSettings(4, "first", 0, 0, kind="zero_shot")
    # no step and no training features: its one epoch is the val pass, 0.155 (+ prompts 0.005)
    assert est.epoch_seconds(zero_shot, COSTS, DTD, DEPTHS, cached=False) == pytest.approx(0.155)
    assert est.run_seconds(zero_shot, 1, COSTS, DTD, DEPTHS) == pytest.approx(0.160)
    # MMA's adapters on the 2 highest of 3 blocks: the prefix ends at block 1, the backward
    # crosses 2 frozen blocks of each tower; image 4 x (0.015 + 0.002 x 2/2) = 0.068, the 5
    # prompts through the 2 blocks above the prefix and back 5 x (0.001 x 2/3 + 0.0005 x 2/2)
    # = 0.0058333, head 0.002                                               -> 0.0758333
    mma = est.RunSettings(4, "first", 0, 0, kind="mma", hooked=(2, 2))
    assert est.step_seconds(mma, COSTS, 5, DEPTHS) == pytest.approx(0.0758333)
    values = {**dict(zip(est.COST_KEYS, (4, "first", 0, 0, False))), "adapter.kind": "mma",
              "model.name": "vacsr-tiny", "adapter.mma_blocks": 2}
    assert est.run_settings(values, DEPTHS) == mma
    # -1, the paper's share of the depth: 7 of every 12 blocks, 2 of 3 here
    assert est.run_settings({**values, "adapter.mma_blocks": -1}, DEPTHS) == mma
    # CoCoOp's prompts are each image's own: 4 x 5 = 20 prompts x CoOp's 0.00175 = 0.035,
    # head 0.002                                                            -> 0.037
    cocoop = est.RunSettings(4, "first", 0, 0, kind="cocoop")
    assert est.step_seconds(cocoop, COSTS, 5, DEPTHS) == pytest.approx(0.037)
    # 11 steps x 0.037 = 0.407; val 10 x 0.015 + its 10 images' 5 prompts 50 x 0.001 = 0.2
    # (0.05 once the image features come from the cache)
    assert est.epoch_seconds(cocoop, COSTS, DTD, DEPTHS, cached=False) == pytest.approx(0.607)
    assert est.epoch_seconds(cocoop, COSTS, DTD, DEPTHS, cached=True) == pytest.approx(0.457)
    # MaPLe's vision prompts enter at block 0: the image backward crosses all 3 frozen blocks,
    # 4 x (0.015 + 0.002 x 3/2) = 0.072; its prompts through the text tower and back, CoOp's
    # 0.00875; head 0.002                                                   -> 0.08275
    maple = est.RunSettings(4, "first", 0, 0, kind="maple", hooked=(3, 3))
    assert est.step_seconds(maple, COSTS, 5, DEPTHS) == pytest.approx(0.08275)
    assert est.run_settings({**values, "adapter.kind": "maple", "adapter.maple_depth": -1},
                            DEPTHS) == maple
    # prompts cut at the longest one's end, half the context: CoOp's 5 prompts x 0.5 x 0.00175
    # + head 0.002 = 0.006375; CoCoOp's 20 x 0.5 x 0.00175 + 0.002 = 0.0195, 11 steps 0.2145,
    # val 10 x 0.015 + its 50 prompts x 0.5 x 0.001 = 0.175                 -> 0.3895
    assert est.step_seconds(coop, COSTS, 5, DEPTHS, 0.5) == pytest.approx(0.006375)
    halved = replace(DTD, prompt_share=0.5)
    assert est.epoch_seconds(cocoop, COSTS, halved, DEPTHS, cached=False) == \
        pytest.approx(0.3895)
    # a method whose prompts are frozen or VACSR's keeps the whole context
    assert est.step_seconds(probe, COSTS, 5, DEPTHS, 0.5) == pytest.approx(0.002)
    assert est.epoch_seconds(zero_shot, COSTS, halved, DEPTHS, cached=False) == \
        pytest.approx(0.155)
    # the plan's share: "<SOT> X X X X <a name of 3 pieces>. <EOT>" = 10 of 16 positions, the
    # init phrase "a photo of a" as long; a count it cannot take (None) leaves it whole
    assert est.prompt_share(("random", "a photo of a"), (4,), 3, 16) == pytest.approx(10 / 16)
    assert est.prompt_share(("random",), (4, 8), 3, 16) == pytest.approx(14 / 16)
    assert est.prompt_share(("random",), (8,), 9, 16) == 1.0
    assert est.prompt_share(("random",), (4,), 0, 16) == est.prompt_share(("random",), (4,), 3,
                                                                          None) == 1.0
    # VACSR's trial of the same shape pays the images every step: 4 x 0.015 + 0.002 = 0.062
    assert est.step_seconds(est.RunSettings(4, "first", 0, 0), COSTS, 5, DEPTHS) == \
        pytest.approx(0.062)


def _hand_plan(tmp_path) -> SweepPlan:
    """Two datasets, three trials, batch size 4 or 8, 2 epochs, seeds 1 and 2 (1: the base)."""
    def config(dataset):
        return from_dict({"model.name": "vacsr-tiny", "data.dataset": dataset,
                          "train.batch_size": 4, "train.epochs": 2, "train.seed": 1,
                          "model.trainable_side": "last", "model.trainable_image_blocks": 1,
                          "model.trainable_text_blocks": 0})
    datasets = ("dtd", "eurosat")
    return SweepPlan(kind=BASE2NOVEL, name="hand", configs={d: config(d) for d in datasets},
                     spaces={d: {"train.batch_size": Choice((4, 8))} for d in datasets},
                     storage=tmp_path, tracking_uri="", trials=3, seeds=(1, 2))


def test_dataset_estimate_by_hand(tmp_path):
    row = dataset_estimate(_hand_plan(tmp_path), "dtd", DTD, COSTS, DEPTHS)
    assert row["batch_sizes"] == [4, 8] and row["steps_per_epoch"] == [5, 11]
    # no stopping: trial 1 at the base batch 4 (1.735), trials 2 and 3 the grid's mean run
    # (1.735 + 1.595) / 2 = 1.665 each, one start-up 2 and teardown 1: 8.065
    assert row["search_no_stop_s"] == pytest.approx(8.065)
    # ASHA (rung 1 only, below max_t 3): trial 2 stops at epoch 1 when below trial 1, half the
    # time: 1.5 epochs; trial 3 stops below the 75th percentile of two: 1/3 (lowest) + 1/3 x
    # 3/4 (middle) = 7/12, 17/12 epochs. A mean run of e epochs: 0.005 + mean first epoch
    # (0.925 + 0.855) / 2 = 0.89 + (e - 1) x mean cached epoch (0.805 + 0.735) / 2 = 0.77
    expected = 1.735 + (0.895 + 0.5 * 0.77) + (0.895 + 5 / 12 * 0.77) + 3
    assert row["search_s"] == pytest.approx(expected, abs=0.03)  # 2,000 simulated searches
    # final: start-up 2 + seed 2 retrained (1.665; seed 1 is the best trial's) + both seeds'
    # tests: (20 + 30 novel) x 0.015 + 5 x 0.001 = 0.755 each                 -> 5.175
    assert row["final_s"] == pytest.approx(5.175)


def test_wall_seconds_and_sharing_by_hand(tmp_path):
    # lanes [5, 0] -> [5, 3] -> 4 joins the free lane at 3: [5, 7]
    assert wall_seconds([5.0, 3.0, 4.0], 2) == 7.0 and wall_seconds([5.0, 3.0, 4.0], 1) == 12.0
    plan = _hand_plan(tmp_path)  # a trial holds 1 CPU: 4 at once on 2 CPUs run at half speed
    assert sharing(plan, {"CPU": 2}, 4) == 2.0 and sharing(plan, {"CPU": 2}, 1) == 1.0
    # two at half speed: the 2 beside the 10 ends at 4 s, the next 2 at 8 s (10 has 6 left),
    # then the 6 alone at full speed: 14 s (a uniform slowdown of the longest lane says 20)
    assert wall_seconds([10.0, 2.0, 2.0], 2, lambda active: float(active)) == pytest.approx(14.0)


def test_the_phases_share_of_a_gpu_cluster_by_hand(tmp_path):
    from vacsr.sweep.cost.utilisation import format_use, phase_use

    plan = _hand_plan(tmp_path)
    plan.trials = 24
    plan.configs = {f"d{i}": plan.configs["dtd"] for i in range(11)}  # 11 units, a GPU a trial
    plan.spaces = {unit: plan.spaces["dtd"] for unit in plan.configs}
    plan.configs["d0"].train.gpus_per_worker = 1.0  # the units share the one config object
    # the default divides the slots: 64 GPUs, 11 units at once, 5 trials each -> 55 held
    assert phase_use(plan, {"CPU": 128, "GPU": 64})["search"] == 55.0
    # --concurrent-trials 1: a trial each -> 11 held; 64 // 11 = 5 trials each fit -> 55
    plan.concurrent_trials = 1
    use = phase_use(plan, {"CPU": 128, "GPU": 64})
    assert use == {"resource": "GPU", "capacity": 64.0, "search": 11.0, "final": 11.0,
                   "fill": 5, "fill_search": 55.0}
    assert format_use(use) == (
        "busy: search 11 of 64 GPU(s) (17%) (--concurrent-trials 5: 55 of 64 GPU(s) (86%)); "
        "final seeds 11 of 64 GPU(s) (17%), a unit's seeds one after another")
    plan.concurrent_trials = 5  # the setting it names holds what it said
    assert phase_use(plan, {"CPU": 128, "GPU": 64})["search"] == 55.0
    # 8 GPUs hold 8 of the 11 units at once, and nothing more to fill
    plan.concurrent_trials = 1
    assert phase_use(plan, {"CPU": 128, "GPU": 8})["fill"] is None
    # a trial of 2 workers of half a GPU each holds one GPU: the same shares
    plan.configs["d0"].train.workers, plan.configs["d0"].train.gpus_per_worker = 2, 0.5
    assert phase_use(plan, {"CPU": 128, "GPU": 64})["search"] == 11.0


def test_the_whole_estimate_by_hand(tmp_path):
    cost = build_sweep_cost(_hand_plan(tmp_path), {"dtd": DTD, "eurosat": EUROSAT}, COSTS,
                            {"CPU": 2})
    # eurosat: batch 4: 5 steps x 0.07 = 0.35, epochs 0.43 / 0.37, 2 epochs 0.805; batch 8:
    # 2 steps 0.28, epochs 0.36 / 0.30, 0.665; mean 0.735. No stopping 0.805 + 2 x 0.735 + 3
    # = 5.275; final 2 + 0.735 + 2 x ((10 + 10) x 0.015 + 0.005) = 3.345
    t = cost["totals"]
    assert t["search_no_stop_device_s"] == pytest.approx(8.065 + 5.275)
    assert t["final_device_s"] == pytest.approx(5.175 + 3.345)
    # 2 CPUs hold 2 one-CPU trials: both datasets at once, 1 trial each, no sharing; the wall
    # time is the longer lane: dtd 8.065 + 5.175 = 13.24
    assert (cost["parallel_datasets"], cost["concurrent_trials"], cost["cpu_sharing"]) == (2, 1,
                                                                                           1.0)
    assert t["wall_no_stop_s"] == pytest.approx(13.24)
    assert cost["datasets"][0]["peak_bounded_by"] == "train.batch_size"


def test_durations_read_in_their_unit():
    assert [duration(s) for s in (0.2, 59.0, 61.0, 3599.5, 3600.0, 5 * 3600 + 61)] == [
        "1 s", "59 s", "1 min 01 s", "1 h 00 min", "1 h 00 min", "5 h 02 min"]


def test_memory_figures_show_the_comparison():
    assert comparable(0.0273, 0.001) == ("0.027", "0.001")
    assert comparable(1.04, 1.0) == ("1.04", "1")  # 2 digits would read "1" and "1"
    assert comparable(0.25000004, 0.25)[0] != "0.25"


def test_asha_search_by_hand():
    # max 8 epochs: rungs 1 and 4 (max_t 9). Trial 2 (0.3) meets the cutoff 0.5 at rung 1; trial
    # 3 (0.9) the 75th percentile of [0.3, 0.5] = 0.3 + 0.75 x 0.2 = 0.45 at rung 1, then 0.5 at
    # rung 4; trial 4 (0.6) that of [0.3, 0.5, 0.9] = 0.5 + 0.5 x 0.4 = 0.7 at rung 1; trial 5
    # asks for 3 epochs, passes rung 1 (0.6 + 0.25 x 0.3 = 0.675) and never reaches rung 4
    assert ASHA.rungs(8) == [1, 4] and ASHA.rungs(25) == [1, 4, 16]
    trials = [(8, 0.5), (8, 0.3), (8, 0.9), (8, 0.6), (3, 0.95)]
    assert est.asha_search(trials, 8) == [8, 1, 8, 1, 3]
    assert est.asha_epochs([(2,)] * 3, 2) == pytest.approx([2, 1.5, 17 / 12], abs=0.04)


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_the_estimates_asha_stops_what_rays_asha_stops():
    """Ray's own ASHAScheduler, built from the sweep's schedule as Tune's is, driven through its
    public trial callbacks on synthetic learning curves (each trial's value the same at every
    epoch, as the estimate assumes): each trial stops at the epoch the estimate's search says."""
    from ray.tune.schedulers import ASHAScheduler

    rng = random.Random(7)
    for search in range(150):
        max_epochs = rng.choice((4, 8, 16))
        trials = [(rng.randint(1, max_epochs), rng.random()) for _ in range(rng.randint(2, 9))]
        ray_asha = ASHAScheduler(time_attr="epoch", metric="val/acc", mode="max",
                                 max_t=ASHA.max_t(max_epochs), grace_period=ASHA.grace_period,
                                 reduction_factor=ASHA.reduction_factor)
        ran = []
        for index, (own, value) in enumerate(trials):
            trial = SimpleNamespace(trial_id=f"t{index}")
            ray_asha.on_trial_add(None, trial)
            for epoch in range(1, own + 1):
                result = {"epoch": epoch, "val/acc": value}
                if ray_asha.on_trial_result(None, trial, result) == ASHAScheduler.STOP:
                    break
            ray_asha.on_trial_complete(None, trial, result)
            ran.append(epoch)
        assert est.asha_search(trials, max_epochs) == ran, (search, trials)


def test_the_plans_memory_charges_the_classes_counted_not_imagenet_1ks(tmp_path, monkeypatch):
    """The embedded profile's ImageNet has 200 classes: CoCoOp's step encodes 100 base prompts
    per image, not ImageNet-1k's 500; the check made before counting keeps the upper bound."""
    from conftest import sweep_plan
    from vacsr.sweep.cost.counts import synthetic_counts
    from vacsr.sweep.cost.memory import memory_peaks

    plan = sweep_plan(BASE2NOVEL, tmp_path, ["--datasets", "imagenet", "--methods", "cocoop"],
                      monkeypatch=monkeypatch)
    [unit] = plan.datasets
    counts = synthetic_counts(BASE2NOVEL, "imagenet", 2, plan.synthetic)
    assert counts.prompts == plan.synthetic.imagenet_classes // 2
    row = build_sweep_cost(plan, {unit: counts}, COSTS, {"CPU": 2})["datasets"][0]
    counted = memory_peaks(plan, {unit: counts.prompts})[unit][2]
    assert row["peak_gib"] == round(counted, 3)
    assert counted < memory_peaks(plan)[unit][2] / 3  # 100 of 500 prompts: most of the peak


def test_units_start_longest_first_and_the_wall_time_follows_that_order(tmp_path):
    """On 2 lanes, units of 3, 4 and 10 s in plan order end at 13 s (the 10 s unit starts when
    the 3 s one ends); longest first, at 10 s. The estimate's order is the driver's."""
    from vacsr.sweep.cost.sweep_cost import longest_first

    lengths = {"a": 3.0, "b": 4.0, "c": 10.0}
    assert wall_seconds(list(lengths.values()), 2) == 13.0
    order = longest_first(lengths)
    assert order == ["c", "b", "a"]
    assert wall_seconds([lengths[u] for u in order], 2) == 10.0
    assert longest_first({"x": 1.0, "y": 2.0, "z": 1.0}) == ["y", "x", "z"]  # ties: plan order
    plan = _hand_plan(tmp_path)
    plan.configs = {d: plan.configs[d] for d in ("eurosat", "dtd")}  # the shorter one first
    cost = build_sweep_cost(plan, {"dtd": DTD, "eurosat": EUROSAT}, COSTS, {"CPU": 1})
    assert cost["unit_order"] == ["dtd", "eurosat"]
    # one lane: the units one after the other, whatever the order
    assert cost["totals"]["wall_no_stop_s"] == pytest.approx(13.24 + 8.62)
