"""What a sweep will cost, before it runs (`--plan`, and the run's own `sweep_cost.json`): per
dataset its counts, steps, trials and estimated device-seconds, the peak memory of its largest
configuration against the device's, then totals and the wall time on the resources the sweep
would get. The formula is in vacsr/sweep/cost/estimate.py and docs/sweeps.md.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Mapping

from vacsr.config import DEFAULT_METHOD, flatten
from vacsr.methods.method import Method
from vacsr.methods.registry import method_of
from vacsr.model.prompt_room import COUNT_KEY, INIT_KEY, text_positions
from vacsr.sweep.cost import estimate as est
from vacsr.sweep.cost.calibrate import StepCosts
from vacsr.sweep.cost.counts import DatasetCounts
from vacsr.sweep.cost.memory import check_memory, memory_peaks
from vacsr.sweep.cost.utilisation import format_use, phase_use
from vacsr.sweep.plan.plan import (
    SweepPlan,
    sweep_parallelism,
    trains_in_trial,
    trial_resources,
    trial_slots,
)
from vacsr.sweep.spec.schedule import longest_epochs
from vacsr.sweep.spec.space import start_point, tower_depths


def _epoch_choices(plan: SweepPlan, dataset: str) -> tuple[int, ...]:
    return est.values_of(plan.spaces[dataset].get("train.epochs"),
                         plan.configs[dataset].train.epochs)


def _trial_epochs(plan: SweepPlan, dataset: str) -> list[tuple[int, ...]]:
    """The epochs each trial may run: the first is the base config's (start_point), the rest are
    drawn from the space."""
    space, base = plan.spaces[dataset], plan.configs[dataset]
    first = start_point(space, base).get("train.epochs", base.train.epochs)
    return [(first,)] + [_epoch_choices(plan, dataset)] * (plan.trials_of(dataset) - 1)


def _test_seconds(counts: DatasetCounts, costs: StepCosts, method: Method) -> float:
    """A final seed's test passes; prompts conditioned on each image (CoCoOp) go through the
    text tower once per image."""
    images = counts.test + sum(counts.evaluations.values())
    return (images * (costs.image_load + costs.image_forward)
            + est.prompt_texts(method, counts, images) * costs.text_forward)


def with_prompt_share(plan: SweepPlan, dataset: str, counts: DatasetCounts) -> DatasetCounts:
    """`counts` with the share of the text context the unit's prompts run over, where its
    method encodes them (estimate.prompt_share: the longest context its space draws)."""
    if not method_of(plan.method_of(dataset)).encodes_prompts:
        return counts
    base = plan.configs[dataset]
    space, flat = plan.spaces[dataset], flatten(base)
    options = [est.values_of(space.get(key), flat[key]) for key in (INIT_KEY, COUNT_KEY)]
    share = est.prompt_share(*options, counts.name_pieces, text_positions(base.model.name))
    return replace(counts, prompt_share=share)


def dataset_estimate(plan: SweepPlan, dataset: str, counts: DatasetCounts, costs: StepCosts,
                     depths: tuple[int, int]) -> dict:
    """One dataset's plan entry: counts, steps, trials, epochs and device-seconds."""
    counts = with_prompt_share(plan, dataset, counts)
    space, base = plan.spaces[dataset], plan.configs[dataset]
    flat = flatten(base)
    grid = est.settings_grid(space, flat, depths)
    first = est.run_settings({**flat, **start_point(space, base)}, depths)
    choices = _epoch_choices(plan, dataset)
    trial_epochs = _trial_epochs(plan, dataset)
    expected = est.asha_epochs(trial_epochs, longest_epochs(space, base.train.epochs))
    upper = [sum(c) / len(c) for c in trial_epochs]

    starts = 1 if trains_in_trial(base.train) else plan.trials_of(dataset)  # one actor, or each

    def search(epochs: list[float]) -> float:
        runs = [est.run_seconds(first, epochs[0], costs, counts, depths)]
        runs += [est.mean_run_seconds(grid, e, costs, counts, depths) for e in epochs[1:]]
        return sum(runs) + starts * costs.startup + costs.teardown

    mean_epochs = sum(choices) / len(choices)
    seeds = plan.seeds_of(dataset)
    retrained = sum(seed != base.train.seed for seed in seeds)  # the best trial's seed: reused
    final = (costs.startup + retrained * est.mean_run_seconds(grid, mean_epochs, costs, counts,
                                                              depths)
             + len(seeds) * _test_seconds(counts, costs, method_of(plan.method_of(dataset))))
    sizes = sorted({run.batch_size for run in grid})
    return {"dataset": dataset, "method": plan.method_of(dataset),
            **{k: v for k, v in counts.as_dict().items() if k != "samples"},
            "batch_sizes": sizes, "steps_per_epoch": [counts.train // b for b in sizes[::-1]],
            "trials": plan.trials_of(dataset), "epochs": [min(choices), max(choices)],
            "trial_s": search(expected) / plan.trials_of(dataset),
            "search_s": search(expected), "search_no_stop_s": search(upper),
            "final_s": final}


def longest_first(lengths: Mapping[str, float]) -> list[str]:
    """The units by their estimated wall seconds, longest first (ties in plan order): the order
    the driver starts them in. A long unit then runs beside the short ones instead of alone at
    the end (longest-processing-time list scheduling, within 4/3 of the best order); the order
    changes when runs start, not what they record (each unit's search and seeds are its own)."""
    return sorted(lengths, key=lambda unit: -lengths[unit])


def wall_seconds(durations: list[float], parallel: int,
                 slowdown: Callable[[int], float] = lambda active: 1.0) -> float:
    """Datasets started in order on `parallel` lanes, each lane taking the next when free; while
    `active` datasets run, each advances by 1 / slowdown(active) of its device-seconds per second
    (CPU trials sharing the CPUs: `sharing`), so a long dataset left running alone at the end
    runs at full speed."""
    pending, running, clock = list(durations), [], 0.0
    while pending or running:
        while pending and len(running) < max(parallel, 1):
            running.append(pending.pop(0))
        done = min(running)  # device-seconds until the next dataset ends
        clock += done * slowdown(len(running))
        running = [left - done for left in running if left - done > 1e-9]
    return clock


def sharing(plan: SweepPlan, resources: dict, trials_at_once: int) -> float:
    """How much slower each CPU trial runs when those running at once want more threads than the
    cluster has CPUs (a trial of 0.5 CPU still computes on a whole thread, as calibrated)."""
    resource = trial_resources(plan.configs[plan.datasets[0]].train, plan.trial_cpus)
    if resource.get("GPU", 0) > 0:
        return 1.0
    threads = trials_at_once * max(1, int(resource["CPU"]))
    return max(1.0, threads / max(resources.get("CPU", 1), 1))


def build_sweep_cost(plan: SweepPlan, counts: dict[str, DatasetCounts], costs: StepCosts,
                     resources: dict) -> dict:
    """The whole estimate as JSON-ready data (`--plan-out`, the run's artifact), in seconds.
    Refuses the sweep in one line when a configuration cannot fit the calibration's GPU (with
    `--device-memory-gib` the command line has checked it already: vacsr/sweep/cost/memory.py)."""
    depths = tower_depths(plan.configs[plan.datasets[0]].model.name) or (1, 1)
    peaks = memory_peaks(plan, {d: counts[d].prompts for d in plan.datasets})
    device_gib = plan.device_memory_gib or costs.memory_gib
    if plan.device_memory_gib is None and device_gib is not None:
        check_memory(plan, peaks, device_gib)
    rows = [dataset_estimate(plan, d, counts[d], costs, depths)
            | {"peak_gib": round(peaks[d][2], 3), "peak_bounded_by": peaks[d][0]}
            for d in plan.datasets]
    parallel, per_dataset = sweep_parallelism(plan, resources)
    slow = sharing(plan, resources, parallel * per_dataset)  # all lanes busy

    order = longest_first({r["dataset"]: r["search_s"] / per_dataset + r["final_s"]
                           for r in rows})

    def wall(key: str) -> float:
        lanes = {r["dataset"]: r[key] / per_dataset + r["final_s"] for r in rows}
        return wall_seconds([lanes[unit] for unit in order], parallel,
                            lambda active: sharing(plan, resources, active * per_dataset))

    total = lambda key: sum(r[key] for r in rows)  # noqa: E731
    model = plan.configs[plan.datasets[0]].model.name
    return {"sweep": plan.name, "kind": plan.kind.name, "model": model,
            "measured_on": costs.as_dict(),
            "resources": {k: resources[k] for k in ("CPU", "GPU") if k in resources},
            "device_memory_gib": device_gib, "parallel_datasets": parallel,
            "concurrent_trials": per_dataset, "trial_slots": trial_slots(plan, resources),
            "cpu_sharing": slow, "seeds": list(plan.seeds),
            "busy": phase_use(plan, resources),
            "datasets": rows, "unit_order": order,
            "totals": {"search_device_s": total("search_s"),
                       "search_no_stop_device_s": total("search_no_stop_s"),
                       "final_device_s": total("final_s"),
                       "wall_s": wall("search_s"), "wall_no_stop_s": wall("search_no_stop_s")}}


def unit_paces(cost: dict) -> dict[str, tuple[float, float]]:
    """Per unit the estimated wall seconds of a trial (its concurrent trials sharing the unit's
    search) and of its final seeds, CPU sharing included: the progress ETA's units."""
    share = cost.get("cpu_sharing", 1.0)
    per_unit = max(1, cost.get("concurrent_trials", 1))
    return {r["dataset"]: (r["trial_s"] * share / per_unit, r["final_s"] * share)
            for r in cost["datasets"]}


def format_sweep_cost(cost: dict) -> str:
    """The estimate as the console shows it: one row per dataset, then the totals."""
    m = cost["measured_on"]
    resources = ", ".join(f"{v:g} {k}" for k, v in cost["resources"].items())
    # the first column fits the longest unit name (`imagenet.sigmoid_baseline` with --methods)
    width = max([16, *(len(r["dataset"]) + 2 for r in cost["datasets"])])
    lines = [f"plan of sweep {cost['sweep']} ({cost['kind']}, {cost['model']}), costs measured "
             f"on {m['device']}",
             f"{cost['parallel_datasets']} dataset(s) at a time, {cost['concurrent_trials']} "
             f"trial(s) each (of {cost.get('trial_slots', '?')} trial slots; the table depends "
             f"on the trials at once), on {resources}",
             f"{'dataset':<{width}}{'train':>7}{'val':>6}{'test':>7}{_other(cost):>7}{'steps/ep':>10}"
             f"{'trials':>7}{'epochs':>8}{'trial s':>9}{'final s':>9}{'peak GiB':>9}"]
    for r in cost["datasets"]:
        novel = sum(r["evaluations"].values())
        steps = "%d-%d" % (min(r["steps_per_epoch"]), max(r["steps_per_epoch"]))
        lines.append(f"{r['dataset']:<{width}}{r['train']:>7}{r['val']:>6}{r['test']:>7}{novel:>7}"
                     f"{steps:>10}{r['trials']:>7}{'%d-%d' % tuple(r['epochs']):>8}"
                     f"{r['trial_s']:>9.1f}{r['final_s']:>9.1f}{r['peak_gib']:>9.2f}")
    lines += _per_method(cost["datasets"])
    t = cost["totals"]
    lines.append(f"search {duration(t['search_device_s'])} of device time with ASHA's expected "
                 f"stops ({duration(t['search_no_stop_device_s'])} without); final seeds "
                 f"{duration(t['final_device_s'])}")
    lines.append(f"wall time {duration(t['wall_s'])} (at most {duration(t['wall_no_stop_s'])})")
    if "busy" in cost:  # a plan written before it was estimated has none
        lines.append(format_use(cost["busy"]))
    return "\n".join(lines)


def _per_method(rows: list[dict]) -> list[str]:
    """Each method's device time (search with ASHA's expected stops, and final seeds) where the
    sweep runs more than one (`--methods`)."""
    methods = list(dict.fromkeys(r.get("method", DEFAULT_METHOD) for r in rows))
    if len(methods) < 2:
        return []
    spent = {m: [0.0, 0.0] for m in methods}
    for r in rows:
        spent[r.get("method", DEFAULT_METHOD)][0] += r["search_s"]
        spent[r.get("method", DEFAULT_METHOD)][1] += r["final_s"]
    return ["per method: " + "; ".join(f"{m} {duration(a)} + {duration(b)} final"
                                       for m, (a, b) in spent.items())]


def _other(cost: dict) -> str:
    """The column of the kind's other test images: the novel classes', or every shift's."""
    names = {name for r in cost["datasets"] for name in r["evaluations"]}
    return "novel" if names <= {"novel_acc"} else "shifts"


def duration(seconds: float) -> str:
    """Seconds in the unit that reads: "42 s", "7 min 05 s", "3 h 12 min" (rounded up)."""
    whole = math.ceil(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min"
