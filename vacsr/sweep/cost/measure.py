"""The cost estimate of a checked SweepPlan: the counts from its data, the step costs measured by
a calibration task where its trials would run, or kept from an earlier measurement of the same
step (cost_store.py), composed by vacsr/sweep/cost/sweep_cost.py. Writes nothing but the kept
costs: the machine's, and with `keep_in_folder` (a run) the sweep folder's.

The embedded profile's synthetic data, when the sweep folder holds none yet (a `--plan`: a run
writes it before it plans), is counted from the sizes the generator would write, and only the
few images the calibration decodes are written, to a temporary folder deleted after; COCO's
synthetic layout (85 images) is written there whole.
"""
from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

from vacsr.sweep.cost.calibrate import StepCosts, run_calibration
from vacsr.sweep.cost.cost_key import cost_key
from vacsr.sweep.cost.cost_store import CostSource, obtain_costs, source_line
from vacsr.sweep.cost.counts import SAMPLES, DatasetCounts, count_dataset, synthetic_counts
from vacsr.sweep.cost.sweep_cost import build_sweep_cost
from vacsr.sweep.plan.folders import costs_file
from vacsr.sweep.plan.plan import (
    SweepPlan,
    local_resources,
    sweep_parallelism,
    trial_resources,
)

GENERATED = ".generated"  # the embedded profile's mark of finished synthetic data


def sweep_counts(plan: SweepPlan, root: Path) -> dict[str, DatasetCounts]:
    return {d: count_dataset(plan.kind, root, plan.dataset_of(d), plan.configs[d].data.shots)
            for d in plan.datasets}


@contextlib.contextmanager
def counted(plan: SweepPlan) -> Iterator[dict[str, DatasetCounts]]:
    """Each dataset's counts, the first one's sample images on disk while inside: counted in
    the runs' own folder, or for the embedded profile (`plan.synthetic`) with no data there
    yet, computed from the profile (module docstring)."""
    root = Path(plan.configs[plan.datasets[0]].data.root or "")
    sizes = plan.synthetic
    if sizes is None or (root / GENERATED).is_file():
        yield sweep_counts(plan, root)
        return
    kind, first = plan.kind, plan.datasets[0]
    with tempfile.TemporaryDirectory(prefix="vacsr-plan-") as folder:
        if kind.task == "retrieval":
            from vacsr.data.generate import generate_sizes

            names = [d for d in kind.data_needed(plan.data_names) if d not in kind.also_accepts]
            generate_sizes(folder, sizes, datasets=names)
            yield sweep_counts(plan, Path(folder))
            return
        from vacsr.data.generate import write_samples

        counts = {d: synthetic_counts(kind, plan.dataset_of(d), plan.configs[d].data.shots,
                                      sizes)
                  for d in plan.datasets}  # d: a unit (vacsr/sweep/plan/plan.py)
        counts[first] = replace(counts[first], samples=write_samples(
            folder, plan.dataset_of(first), SAMPLES))
        yield counts


@contextlib.contextmanager
def joined(address: str | None) -> Iterator[None]:
    """Joined to the cluster at `address` while inside (left after, if joined here); without an
    address nothing starts: a local Ray starts only to measure (run_calibration)."""
    ray = sys.modules.get("ray")
    if not address or (ray is not None and ray.is_initialized()):
        yield
        return
    import ray

    from vacsr.distributed.cluster import ensure_ray

    ensure_ray(address=address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def cluster_resources(resources: dict[str, float]) -> dict:
    """What the sweep would get: the joined Ray's resources, else this machine's CPUs (and GPUs
    where trials take them), as a local Ray instance of the sweep's would have them."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return dict(ray.cluster_resources())
    return local_resources(resources.get("GPU", 0) > 0)


def plan_step_costs(plan: SweepPlan, samples: tuple[str, ...], keep_in_folder: bool,
                    stop_check: Callable[[], None]) -> tuple[StepCosts, dict, CostSource]:
    """(costs, the resources the sweep gets, where the costs came from) of `plan`'s step, kept
    or measured (cost_store.obtain_costs); says where they came from in one line. `stop_check`
    raises a stop noted while a calibration runs (calibrate.run_calibration)."""
    first = plan.configs[plan.datasets[0]]
    resources = trial_resources(first.train, plan.trial_cpus)
    measured: dict[str, dict] = {}

    def measure() -> StepCosts:
        costs, measured["resources"] = run_calibration(first, samples, resources,
                                                       plan.ray_address, stop_check,
                                                       plan.verbose)
        return costs

    with joined(plan.ray_address):
        # a --concurrent-trials the cluster cannot hold: refused before any calibration
        sweep_parallelism(plan, cluster_resources(resources))
        start = time.perf_counter()
        key = cost_key(first, samples, resources, plan.ray_address)
        keyed = time.perf_counter() - start
        costs, source = obtain_costs(key, measure, folder_entry=costs_file(plan.storage),
                                     keep_in_folder=keep_in_folder,
                                     recalibrate=plan.recalibrate)
        source = replace(source, seconds=source.seconds + keyed)  # the key's time included
        found = measured.get("resources") or cluster_resources(resources)
    print(source_line(costs, source), flush=True)
    return costs, found, source


def measure_sweep_cost(plan: SweepPlan, stop_check: Callable[[], None] = lambda: None,
                       keep_in_folder: bool = False) -> dict:
    """The cost estimate (sweep_cost.build_sweep_cost's data) of `plan`, with where its costs
    came from (`costs_from`); `keep_in_folder`: a run's, its costs kept in its sweep folder."""
    with counted(plan) as counts:
        costs, resources, source = plan_step_costs(plan, counts[plan.datasets[0]].samples,
                                                   keep_in_folder, stop_check)
    return build_sweep_cost(plan, counts, costs, resources) | {"costs_from": source.as_dict()}
