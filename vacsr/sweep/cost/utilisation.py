"""How much of the cluster each phase of a sweep keeps busy, and which setting would fill it
(`--plan`'s `busy` line, and the plan's JSON).

The search runs `parallel` units at once with `per_unit` trials each (vacsr/sweep/plan/plan.py
`sweep_parallelism`), each trial holding its needs (`trial_needs`); the final phase runs each
unit's seeds one after another, so it holds one run's needs per unit at once. Counted in GPUs where
trials take GPUs, else in CPUs.
"""
from __future__ import annotations

from vacsr.sweep.plan.plan import SweepPlan, sweep_parallelism, trial_needs


def phase_use(plan: SweepPlan, resources: dict) -> dict:
    """What each phase holds at once of the cluster's GPUs (else CPUs): {"resource",
    "capacity", "search", "final", "fill": the --concurrent-trials that would hold more of it in
    the search (None when nothing would), "fill_search": what that holds}."""
    train = plan.configs[plan.datasets[0]].train
    resource = "GPU" if train.gpus_per_worker > 0 else "CPU"
    capacity = float(resources.get(resource, 0.0))
    need = trial_needs(train, plan.trial_cpus).get(resource, 0.0)
    parallel, per_unit = sweep_parallelism(plan, resources)
    # the finals: one run of the trial's workers per unit at a time
    final_need = train.workers * (train.gpus_per_worker if resource == "GPU"
                                  else train.cpus_per_worker)
    fill = None
    if need > 0:
        trials = max(plan.trials_of(unit) for unit in plan.datasets)
        best = min(trials, int(capacity // need) // parallel)  # a unit's share of the slots
        fill = best if best > per_unit else None
    return {"resource": resource, "capacity": capacity, "search": parallel * per_unit * need,
            "final": parallel * final_need, "fill": fill,
            "fill_search": parallel * fill * need if fill else None}


def format_use(use: dict) -> str:
    """The console's line: each phase's held share, and the setting that would fill the search."""
    def share(held: float) -> str:
        percent = 100 * held / use["capacity"] if use["capacity"] else 0.0
        return f"{held:g} of {use['capacity']:g} {use['resource']}(s) ({percent:.0f}%)"

    line = f"busy: search {share(use['search'])}"
    if use["fill"]:
        line += f" (--concurrent-trials {use['fill']}: {share(use['fill_search'])})"
    return line + f"; final seeds {share(use['final'])}, a unit's seeds one after another"
