"""What a sweep will cost, before it runs: per dataset its counts, steps, trials and estimated
device-seconds, the peak memory of its largest configuration against the device's, then totals
and the wall time on the resources the sweep would get (`--plan`, and the run's own plan
artifact). The formula is in vacsr/sweep/cost/estimate.py and docs/sweeps.md.
"""
from __future__ import annotations

import copy
import math

from vacsr.config import flatten, set_value
from vacsr.errors import ConfigError
from vacsr.sweep.cost import estimate as est
from vacsr.sweep.cost.calibrate import StepCosts
from vacsr.sweep.cost.counts import DatasetCounts
from vacsr.sweep.plan.plan import SweepPlan, plan_parallelism, trains_in_trial, trial_resources
from vacsr.sweep.spec.space import start_point, tower_depths

GIB = 2 ** 30


def _epoch_choices(plan: SweepPlan, dataset: str) -> tuple[int, ...]:
    return est.values_of(plan.spaces[dataset].get("train.epochs"),
                         plan.configs[dataset].train.epochs)


def _trial_epochs(plan: SweepPlan, dataset: str) -> list[tuple[int, ...]]:
    """The epochs each trial may run: the first is the base config's (start_point), the rest are
    drawn from the space."""
    space, base = plan.spaces[dataset], plan.configs[dataset]
    first = start_point(space, base).get("train.epochs", base.train.epochs)
    return [(first,)] + [_epoch_choices(plan, dataset)] * (plan.trials - 1)


def _test_seconds(counts: DatasetCounts, costs: StepCosts) -> float:
    images = counts.test + sum(counts.evaluations.values())
    return images * (costs.image_load + costs.image_forward) + counts.prompts * costs.text_forward


def dataset_estimate(plan: SweepPlan, dataset: str, counts: DatasetCounts, costs: StepCosts,
                     depths: tuple[int, int]) -> dict:
    """One dataset's plan entry: counts, steps, trials, epochs and device-seconds."""
    space, base = plan.spaces[dataset], plan.configs[dataset]
    flat = flatten(base)
    grid = est.shapes(space, flat)
    first = est.Shape(*(start_point(space, base).get(key, flat[key]) for key in est.COST_KEYS))
    choices = _epoch_choices(plan, dataset)
    trial_epochs = _trial_epochs(plan, dataset)
    expected = est.asha_epochs(trial_epochs, max(max(choices), base.train.epochs))
    upper = [sum(c) / len(c) for c in trial_epochs]

    starts = 1 if trains_in_trial(base.train) else plan.trials  # one reused actor, or each

    def search(epochs: list[float]) -> float:
        runs = [est.run_seconds(first, epochs[0], costs, counts, depths)]
        runs += [est.mean_run_seconds(grid, e, costs, counts, depths) for e in epochs[1:]]
        return sum(runs) + starts * costs.startup + costs.teardown

    mean_epochs = sum(choices) / len(choices)
    retrained = sum(seed != base.train.seed for seed in plan.seeds)  # the best trial's seed: reused
    final = (costs.startup + retrained * est.mean_run_seconds(grid, mean_epochs, costs, counts,
                                                              depths)
             + len(plan.seeds) * _test_seconds(counts, costs))
    sizes = sorted({shape.batch_size for shape in grid})
    return {"dataset": dataset, **{k: v for k, v in counts.as_dict().items() if k != "samples"},
            "batch_sizes": sizes, "steps_per_epoch": [counts.train // b for b in sizes[::-1]],
            "trials": plan.trials, "epochs": [min(choices), max(choices)],
            "trial_s": search(expected) / plan.trials,
            "search_s": search(expected), "search_no_stop_s": search(upper),
            "final_s": final}


def worst_memory(plan: SweepPlan, dataset: str, prompts: int) -> tuple[str, int, dict]:
    """(key, value, estimate) of the largest configuration the space can draw: its largest batch
    size with the most blocks training, on the side that keeps the most activations."""
    space, base = plan.spaces[dataset], plan.configs[dataset]
    config = copy.deepcopy(base)
    flat = flatten(base)
    for key in est.COST_KEYS:
        values = est.values_of(space.get(key), flat[key])
        if key.endswith("side"):
            worst = "first" if "first" in values else values[0]
        else:  # -1: every block
            worst = -1 if -1 in values else max(values)
        set_value(config, key, worst)
    from vacsr.model.memory import estimate_for_config

    batch = config.train.batch_size
    return "train.batch_size", batch, estimate_for_config(config, texts=prompts or None)


def check_memory(plan: SweepPlan, prompts: dict[str, int], device_gib: float | None) -> dict:
    """Dataset -> estimated peak GiB of its largest configuration; refuses the sweep in one line
    when one cannot fit `device_gib` (None: no device memory known, nothing refused)."""
    peaks = {}
    for dataset in plan.datasets:
        key, value, parts = worst_memory(plan, dataset, prompts[dataset])
        peak = parts["total"] / GIB
        peaks[dataset] = round(peak, 3)
        if device_gib is not None and peak > device_gib:
            m = plan.configs[dataset].model
            raise ConfigError(
                f"{dataset}: {key}={value} needs an estimated {peak:.1f} GiB per worker "
                f"(model {m.name}, the most blocks and side the space allows), more than the "
                f"device's {device_gib:g} GiB; narrow it with --range {key}=choice:... or more "
                "--workers")
    return peaks


def wall_seconds(durations: list[float], parallel: int) -> float:
    """Datasets started in order on `parallel` lanes, each lane taking the next when free."""
    lanes = [0.0] * max(parallel, 1)
    for duration in durations:
        lanes[lanes.index(min(lanes))] += duration
    return max(lanes)


def sharing(plan: SweepPlan, resources: dict, trials_at_once: int) -> float:
    """How much slower each CPU trial runs when those running at once want more threads than the
    cluster has CPUs (a trial of 0.5 CPU still computes on a whole thread, as calibrated)."""
    resource = trial_resources(plan.configs[plan.datasets[0]].train, plan.trial_cpus)
    if resource.get("GPU", 0) > 0:
        return 1.0
    threads = trials_at_once * max(1, int(resource["CPU"]))
    return max(1.0, threads / max(resources.get("CPU", 1), 1))


def build_cost_plan(plan: SweepPlan, counts: dict[str, DatasetCounts], costs: StepCosts,
                    resources: dict, device_gib: float | None) -> dict:
    """The whole plan as JSON-ready data (`--plan-out`, the run's artifact)."""
    depths = tower_depths(plan.configs[plan.datasets[0]].model.name) or (1, 1)
    memory = check_memory(plan, {d: counts[d].prompts for d in plan.datasets}, device_gib)
    rows = [dataset_estimate(plan, d, counts[d], costs, depths) | {"peak_gib": memory[d]}
            for d in plan.datasets]
    parallel, per_dataset = plan_parallelism(plan, resources)
    slow = sharing(plan, resources, parallel * per_dataset)

    def wall(key: str) -> float:
        return slow * wall_seconds([r[key] / per_dataset + r["final_s"] for r in rows], parallel)

    hours = lambda key: sum(r[key] for r in rows) / 3600  # noqa: E731
    model = plan.configs[plan.datasets[0]].model.name
    return {"sweep": plan.name, "kind": plan.kind.name, "model": model,
            "measured_on": costs.as_dict(),
            "resources": {k: resources[k] for k in ("CPU", "GPU") if k in resources},
            "device_memory_gib": device_gib, "parallel_datasets": parallel,
            "concurrent_trials": per_dataset, "cpu_sharing": slow, "seeds": list(plan.seeds),
            "datasets": rows,
            "totals": {"search_device_h": hours("search_s"),
                       "search_no_stop_device_h": hours("search_no_stop_s"),
                       "final_device_h": hours("final_s"),
                       "wall_h": wall("search_s") / 3600,
                       "wall_no_stop_h": wall("search_no_stop_s") / 3600}}


def trial_pace(cost: dict) -> float:
    """Estimated wall seconds per trial of the whole sweep, final seeds included: the pace the
    progress ETA starts from."""
    trials = sum(r["trials"] for r in cost["datasets"])
    return cost["totals"]["wall_h"] * 3600 / max(trials, 1)


def format_cost_plan(cost: dict) -> str:
    """The plan as the console shows it: one row per dataset, then the totals."""
    m = cost["measured_on"]
    resources = ", ".join(f"{v:g} {k}" for k, v in cost["resources"].items())
    lines = [f"plan of sweep {cost['sweep']} ({cost['kind']}, {cost['model']}), costs measured "
             f"on {m['device']}",
             f"{cost['parallel_datasets']} dataset(s) at a time, {cost['concurrent_trials']} "
             f"trial(s) each, on {resources}",
             f"{'dataset':<16}{'train':>7}{'val':>6}{'test':>7}{_other(cost):>7}{'steps/ep':>10}"
             f"{'trials':>7}{'epochs':>8}{'trial s':>9}{'final s':>9}{'peak GiB':>9}"]
    for r in cost["datasets"]:
        novel = sum(r["evaluations"].values())
        steps = "%d-%d" % (min(r["steps_per_epoch"]), max(r["steps_per_epoch"]))
        lines.append(f"{r['dataset']:<16}{r['train']:>7}{r['val']:>6}{r['test']:>7}{novel:>7}"
                     f"{steps:>10}{r['trials']:>7}{'%d-%d' % tuple(r['epochs']):>8}"
                     f"{r['trial_s']:>9.1f}{r['final_s']:>9.1f}{r['peak_gib']:>9.2f}")
    t = cost["totals"]
    lines.append(f"search {t['search_device_h']:.2f} device-h with ASHA's expected stops "
                 f"({t['search_no_stop_device_h']:.2f} without); final seeds "
                 f"{t['final_device_h']:.2f} device-h")
    lines.append(f"wall time {_hours(t['wall_h'])} (at most {_hours(t['wall_no_stop_h'])})")
    return "\n".join(lines)


def _other(cost: dict) -> str:
    """The column of the kind's other test images: the novel classes', or every shift's."""
    names = {name for r in cost["datasets"] for name in r["evaluations"]}
    return "novel" if names <= {"novel_acc"} else "shifts"


def _hours(hours: float) -> str:
    minutes = math.ceil(hours * 60)
    return f"{minutes // 60} h {minutes % 60:02d} min"
