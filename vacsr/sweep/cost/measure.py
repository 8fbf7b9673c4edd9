"""The cost estimate of a checked SweepPlan: the counts from its data (the embedded profile's
synthetic data, when the sweep folder holds none yet, generated in a temporary folder and
deleted), the step costs measured by a calibration task where its trials would run, composed by
vacsr/sweep/cost/sweep_cost.py. Writes nothing.
"""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from vacsr.sweep.cost.calibrate import run_calibration
from vacsr.sweep.cost.counts import DatasetCounts, count_dataset
from vacsr.sweep.cost.sweep_cost import build_sweep_cost
from vacsr.sweep.plan.plan import SweepPlan, trial_resources

GENERATED = ".generated"  # the embedded profile's mark of finished synthetic data


@contextlib.contextmanager
def data_root(plan: SweepPlan, synthetic_per_class: tuple[int, ...] | None) -> Iterator[Path]:
    """The folder to count in: the runs' own, or with `synthetic_per_class` (the embedded
    profile) and no generated data there yet, a temporary one generated the same way."""
    root = Path(plan.configs[plan.datasets[0]].data.root or "")
    if synthetic_per_class is None or (root / GENERATED).is_file():
        yield root
        return
    from vacsr.data.generate import generate_all

    kind = plan.kind
    names = [d for d in kind.data_needed(plan.datasets) if d not in kind.also_accepts]
    with tempfile.TemporaryDirectory(prefix="vacsr-plan-") as folder:
        generate_all(folder, datasets=names, per_class=tuple(synthetic_per_class))
        yield Path(folder)


def sweep_counts(plan: SweepPlan, root: Path) -> dict[str, DatasetCounts]:
    return {d: count_dataset(plan.kind, root, d, plan.configs[d].data.shots)
            for d in plan.datasets}


def measure_sweep_cost(plan: SweepPlan, stop_check: Callable[[], None] = lambda: None
                       ) -> dict:
    """The cost estimate (sweep_cost.build_sweep_cost's data) of `plan`; `stop_check` raises
    a stop noted while the calibration runs (calibrate.run_calibration)."""
    first = plan.configs[plan.datasets[0]]
    with data_root(plan, plan.synthetic_per_class) as root:
        counts = sweep_counts(plan, root)
        costs, resources = run_calibration(first, counts[plan.datasets[0]].samples,
                                           trial_resources(first.train, plan.trial_cpus),
                                           plan.ray_address, stop_check, plan.verbose)
    return build_sweep_cost(plan, counts, costs, resources)
