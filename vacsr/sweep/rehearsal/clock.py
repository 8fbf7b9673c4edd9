"""What a rehearsed run holds its resources for, and what it reports instead of training.

A rehearsal (`--rehearse SCALE`) runs a sweep's whole machinery for real (Ray scheduling, Tune +
Optuna + ASHA, MLflow, checkpoints, final seeds, reports, `--resume`) with each run's training
replaced: a run sleeps, per epoch, the seconds the sweep's cost model gives for its configuration
(vacsr/sweep/cost/estimate.py, from the step costs `--plan` uses) divided by SCALE, and reports a
seeded synthetic learning curve that depends on the configuration, so that the searcher and ASHA
have something to act on. Nothing here imports torch: a rehearsed trial costs what the framework
costs.

The curve: every searched key has a hidden best point (a hash of the unit and the key); a
configuration's quality q in [0, 1] is the mean closeness of its values to them (a log scale for
log-drawn keys, a hashed score per choice), and a run's validation metric climbs towards
`ceiling * (0.3 + 0.6 q)` at a rate of its own, with seeded noise. Test metrics follow the last
epoch's value, per seed.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from vacsr.config import Config, flatten
from vacsr.config.domains import Choice, Domain, Float, Int, LogFloat
from vacsr.records.names import REHEARSAL_TAG
from vacsr.sweep.cost import estimate as est
from vacsr.sweep.cost.calibrate import StepCosts
from vacsr.sweep.cost.counts import DatasetCounts
from vacsr.sweep.spec.space import active

# what a task's test split reports (vacsr/eval/metrics.py retrieval_metrics: R@1, 5, 10 both
# ways and their sum; classification: accuracy)
RECALL_KS = (1, 5, 10)
CEILING = {"classification": 100.0, "retrieval": 600.0}  # accuracy in %, RSUM
__all__ = ["REHEARSAL_TAG", "UnitClock", "start_rehearsal", "unit_clocks"]


def unit_hash(*parts: Any) -> float:
    """A number in [0, 1) fixed by `parts` (the same in every process and Python version)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


def _position(domain: Domain, value: Any) -> float | None:
    """Where `value` lies in its range, in [0, 1] (a log scale for LogFloat); None for a choice."""
    if isinstance(domain, Choice):
        return None
    low, high = float(domain.low), float(domain.high)
    if high <= low:
        return 0.5
    if isinstance(domain, LogFloat):
        where = (math.log(max(float(value), low)) - math.log(low)) / (math.log(high)
                                                                      - math.log(low))
    elif isinstance(domain, (Float, Int)):
        where = (float(value) - low) / (high - low)
    else:
        return None
    return min(1.0, max(0.0, where))  # a fixed value outside the range: at its nearest end


@dataclass(frozen=True)
class UnitClock:
    """One unit's rehearsal: its costs, counts and space, and the time scale."""

    scale: float  # the cost model's seconds are divided by it
    unit: str
    task: str
    costs: StepCosts
    counts: DatasetCounts
    depths: tuple[int, int]
    space: Mapping[str, Domain] = field(default_factory=dict)
    metric: str = "val/acc"  # the kind's selection metric

    def quality(self, config: Config) -> float:
        """How good `config` is for this unit, in [0, 1] (module docstring)."""
        values = flatten(config)
        scores = []
        for key, domain in sorted(self.space.items()):
            if not active(domain, values):  # not drawn: the config's value does nothing
                continue
            position = _position(domain, values.get(key))
            if position is None:
                scores.append(unit_hash(self.unit, key, values.get(key)))
            else:
                scores.append(1.0 - (position - unit_hash(self.unit, key)) ** 2)
        return sum(scores) / len(scores) if scores else 0.5

    def epoch_seconds(self, config: Config, epoch: int) -> float:
        """The wall seconds a rehearsed epoch holds its resources: the cost model's, scaled."""
        values = flatten(config)
        run = est.run_settings(values, self.depths)
        seconds = est.epoch_seconds(run, self.costs, self.counts, self.depths, cached=epoch > 0)
        if epoch == 0:  # what the run computes once: the prompts (and frozen image features)
            seconds += est.start_seconds(run, self.costs, self.counts)
        return seconds / self.scale

    def test_seconds(self) -> float:
        """A final seed's test evaluations (vacsr/sweep/cost/sweep_cost.py's), scaled."""
        images = self.counts.test + sum(self.counts.evaluations.values())
        return (images * (self.costs.image_load + self.costs.image_forward)
                + self.counts.prompts * self.costs.text_forward) / self.scale

    def val(self, config: Config, epoch: int) -> float:
        """The validation metric after epoch `epoch` (0-based) of `config`'s run."""
        seed, quality = config.train.seed, self.quality(config)
        ceiling = CEILING[self.task]
        target = ceiling * (0.3 + 0.6 * quality)
        rate = 1.5 + 3.0 * unit_hash(self.unit, "rate", round(quality, 6))
        noise = (unit_hash(self.unit, "noise", seed, epoch) - 0.5) * 0.02 * ceiling
        return round(max(0.0, target * (1 - math.exp(-(epoch + 1) / rate)) + noise), 4)

    def epoch_metrics(self, config: Config, epoch: int) -> dict[str, float]:
        """What a rehearsed epoch reports: the epoch, a falling loss, the validation metric."""
        loss = 2.0 * math.exp(-(epoch + 1) / 3) * (1.2 - self.quality(config))
        return {"epoch": epoch + 1, "train/loss": round(loss, 6), self.metric: self.val(config,
                                                                                      epoch)}

    def test_metrics(self, config: Config, view: tuple[str | None, str | None]) -> dict:
        """A final seed's metrics of one test view ((dataset, classes); (None, None): the
        split trained on), from the run's last validation value."""
        final = self.val(config, config.train.epochs - 1)
        shift = (unit_hash(self.unit, "test", config.train.seed, *view) - 0.5) * 0.04
        value = final * (1 + shift) * (0.8 if view != (None, None) else 1.0)
        if self.task == "classification" or view != (None, None):
            return {"acc": round(min(value, 100.0), 4)}
        recalls = {f"{way}_r{k}": round(min(100.0, value / 6 * (0.75 + 0.25 * i)), 4)
                   for way in ("i2t", "t2i") for i, k in enumerate(RECALL_KS)}
        return {**recalls, "rsum": round(sum(recalls.values()), 4)}


def unit_clocks(plan, cost: dict, scale: float) -> dict[str, UnitClock]:
    """Every unit's clock, from the sweep's cost estimate (sweep_cost.build_sweep_cost's data:
    the step costs it used and each unit's counts)."""
    from vacsr.sweep.spec.space import tower_depths

    costs = StepCosts(**cost["measured_on"])
    depths = tower_depths(cost["model"]) or (1, 1)
    # a record written before a field was counted takes its default
    fields = ("train", "val", "test", "prompts", "evaluations", "name_pieces", "prompt_share")
    rows = {row["dataset"]: row for row in cost["datasets"]}
    return {unit: UnitClock(scale=scale, unit=unit, task=plan.kind.task, costs=costs,
                            counts=DatasetCounts(**{k: rows[unit][k] for k in fields
                                                    if k in rows[unit]}),
                            depths=depths, space=dict(plan.spaces[unit]), metric=plan.kind.metric)
            for unit in plan.datasets}


def start_rehearsal(plan, cost: dict) -> str:
    """Give `plan` its units' clocks (`unit_clocks`); the line the console says it with."""
    plan.clocks = unit_clocks(plan, cost, plan.rehearse)
    return (f"[{plan.name}] rehearsal (--rehearse {plan.rehearse:g}): Ray, Tune, Optuna, MLflow "
            "and checkpoints run for real; each run waits the cost model's seconds / "
            f"{plan.rehearse:g} instead of training and reports a synthetic curve; its numbers "
            "are not results")
