"""ASHA's schedule as every sweep configures it (paper sec. 4.1 searches with ASHA): the one
source of its grace period, reduction factor and max_t, read by Tune's scheduler
(vacsr/sweep/search/tune.py) and by the cost estimate's expected stops
(vacsr/sweep/cost/estimate.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from vacsr.sweep.spec.space import Choice, Domain, Int


@dataclass(frozen=True)
class AshaSchedule:
    grace_period: int = 1  # epochs every trial runs before its first comparison
    reduction_factor: int = 4  # a rung lets the top 1 / reduction_factor of its trials go on

    def max_t(self, max_epochs: int) -> int:
        """One beyond the longest trial: ASHA stops a trial that reaches max_t at once, which
        would cut off its last MLflow logging (metrics.json, curves); trials that run all their
        epochs must end by themselves."""
        return max(max_epochs, 1) + 1

    def rungs(self, max_epochs: int) -> list[int]:
        """The epochs at which a trial is compared, lowest first: grace period, then each
        times the reduction factor, below max_t (Ray's ASHAScheduler milestones)."""
        rungs, milestone = [], self.grace_period
        while milestone < self.max_t(max_epochs):
            rungs.append(milestone)
            milestone *= self.reduction_factor
        return rungs


ASHA = AshaSchedule()


def longest_epochs(space: dict[str, Domain], base_epochs: int) -> int:
    """The most epochs a trial of `space` can run: the searched range's top, else the config's."""
    domain = space.get("train.epochs")
    if isinstance(domain, Int):
        return max(int(domain.high), base_epochs)
    if isinstance(domain, Choice):
        return max(max(domain.options), base_epochs)
    return base_epochs
