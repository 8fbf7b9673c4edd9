"""How far apart two methods' score is, with a 95% interval: a paired bootstrap over (dataset,
seed) pairs. Each pair holds one method's per-seed score beside the other's on the same dataset
(or evaluated target) and seed: a metric of that seed (RSUM, an accuracy), or the harmonic mean
of two (per-seed H of base and novel, paper sec. 4.2); the difference of the two means is the
mean of the pairs' differences, and resampling the pairs (not datasets and seeds apart) keeps
what a dataset or a seed does to both methods together.

The interval is scipy's BCa (`scipy.stats.bootstrap`, Efron 1987): the percentiles of the
resampled means, moved by the bias (how far the observed mean sits from their median) and the
acceleration (the skew of the leave-one-out means). The plain percentile interval assumes the
resampled means are centred on the observed one and as spread on each side; with a few tens of
pairs, and differences that one dataset can skew, neither is given. Where BCa does not apply,
the percentile interval stays and the record says so: fewer than 3 pairs (a jackknife of one or
two values measures no skew) or every pair's difference equal (no spread: the acceleration is
0 / 0, and the interval is that one value).

Plain data in, plain data out (vacsr/sweep/report/comparison.py lays it out), seeded, so one
sweep's results always give one interval.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, Union

import numpy as np

from vacsr.results import harmonic_mean

RESAMPLES = 10_000  # B, the resamples of the pairs
BOOTSTRAP_SEED = 0  # the numpy Generator's seed: a report is reproducible
LEVEL = 95  # percent: the interval's coverage
BCA, PERCENTILE = "BCa", "percentile"  # the interval's method, as scipy names them
BCA_MIN_PAIRS = 3  # fewer: the percentile interval (a jackknife of two values has no skew)
# a per-seed score: one metric's name, or two whose harmonic mean it is (base and novel: H)
Score = Union[str, tuple[str, str]]


@dataclass(frozen=True)
class PairedInterval:
    """The observed mean difference and its bootstrap interval."""
    observed: float  # mean over the pairs of (reference score - other score)
    low: float  # the interval's ends (LEVEL percent)
    high: float
    pairs: int
    resamples: int
    seed: int
    method: str = BCA  # BCA, or PERCENTILE where BCa does not apply (the module's docstring)


@dataclass(frozen=True)
class Pairing:
    """Two methods' per-seed scores matched by (dataset, seed), and what could not be
    matched."""
    differences: tuple[float, ...]  # reference score - other score, one per pair
    keys: tuple[tuple[str, object], ...]  # (dataset, seed) of each pair, in order
    left_out: int  # (dataset, seed) results of either method without a partner
    left_out_why: tuple[str, ...] = field(default=())  # one phrase per dataset that lost pairs


@dataclass(frozen=True)
class Difference:
    """The reference's score minus another method's: an interval, or the reason there is
    none."""
    label: str  # what the other method is to the reader: "the best other method", "zero-shot"
    reference: str
    other: str | None
    interval: PairedInterval | None = None
    pairing: Pairing | None = None
    reason: str = ""  # why not available, when interval is None
    target: str | None = None  # the row (or summary) it is over; None: every dataset

    @property
    def available(self) -> bool:
        return self.interval is not None


def interval_method(values: np.ndarray) -> str:
    """BCa, or the percentile interval where BCa does not apply (the module's docstring)."""
    return BCA if values.size >= BCA_MIN_PAIRS and np.ptp(values) > 0 else PERCENTILE


def paired_bootstrap(differences: Sequence[float], resamples: int = RESAMPLES,
                     seed: int = BOOTSTRAP_SEED) -> PairedInterval:
    """Resample the pairs' differences with replacement `resamples` times and take each
    resample's mean; the interval is BCa's over those means (or their percentiles). The pairs
    are datasets x seeds (tens): the (resamples, pairs) draw is a few MB at most."""
    values = np.asarray(differences, dtype=np.float64)  # (pairs,)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"differences: expected at least one pair, got {values.size}")
    if resamples < 1:
        raise ValueError(f"resamples={resamples}: expected a positive count")
    from scipy import stats  # 0.75 CPU-s to import: paid by a process that compares methods

    method = interval_method(values)
    if values.size == 1:  # scipy resamples two or more; one pair's every resample is itself
        low = high = float(values[0])
    else:
        found = stats.bootstrap((values,), np.mean, n_resamples=resamples,
                                confidence_level=LEVEL / 100, method=method,
                                rng=np.random.default_rng(seed))
        low, high = map(float, found.confidence_interval)
    return PairedInterval(observed=float(values.mean()), low=low, high=high,
                          pairs=int(values.size), resamples=resamples, seed=seed,
                          method=method)


def per_seed_score(entry: dict, score: Score) -> float:
    """One seed's score: its metric, or the harmonic mean of its two (one seed's H from its base
    and novel, not from averages: that is the table's H)."""
    if isinstance(score, str):
        return float(entry[score])
    return harmonic_mean(entry[score[0]], entry[score[1]])


def _by_seed(result: dict | None, score: Score) -> dict[object, float]:
    return {} if result is None else {s["seed"]: per_seed_score(s, score)
                                      for s in result["per_seed"]}


def pair_seeds(reference: dict[str, dict], other: dict[str, dict], score: Score,
               other_is_single: bool = False, names: tuple[str, str] = ("reference", "other"),
               failed: tuple[dict[str, str], dict[str, str]] = ({}, {})) -> Pairing:
    """Pair reference[dataset] and other[dataset] (results as the table takes them) by seed.

    `other_is_single`: the other method was evaluated once per dataset (no training: zero-shot),
    so its one value pairs with every seed of the reference. A dataset either method lacks
    (failed, or never run) keeps no pairs: each of the other's results there counts as left out,
    and `failed` (method -> dataset -> reason, the reference's then the other's) says why."""
    differences: list[float] = []
    keys: list[tuple[str, object]] = []
    left_out, why = 0, []
    for dataset in dict.fromkeys([*reference, *other, *failed[0], *failed[1]]):
        mine = _by_seed(reference.get(dataset), score)
        theirs = _by_seed(other.get(dataset), score)
        if other_is_single and theirs:
            theirs = dict.fromkeys(mine or theirs, next(iter(theirs.values())))
        matched = [seed for seed in mine if seed in theirs]
        for seed in matched:
            differences.append(mine[seed] - theirs[seed])
            keys.append((dataset, seed))
        lost = len(set(mine) | set(theirs)) - len(matched)
        if lost:
            left_out += lost
            why.append(_why_lost(dataset, mine, theirs, names, failed))
    return Pairing(tuple(differences), tuple(keys), left_out, tuple(why))


def _why_lost(dataset: str, mine: dict, theirs: dict, names: tuple[str, str],
              failed: tuple[dict[str, str], dict[str, str]]) -> str:
    absent = [(name, reasons.get(dataset)) for name, results, reasons
              in zip(names, (mine, theirs), failed) if not results]
    if absent:
        return f"{dataset}: " + "; ".join(
            f"{name} failed ({reason})" if reason else f"{name} has no result"
            for name, reason in absent)
    unmatched = sorted(map(str, set(mine) ^ set(theirs)))
    return f"{dataset}: seed(s) {', '.join(unmatched)} in one method only"


def compare(label: str, reference: str, other: str | None, results: dict[str, dict],
            failed: dict[str, dict], score: Score, single: set[str],
            resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
            missing: str = "", target: str | None = None, unit: str = "dataset") -> Difference:
    """The reference's score minus `other`'s over their (dataset, seed) pairs; not available,
    with the reason, when a method is absent (the reference's reason first) or no pair exists.
    `single`: methods evaluated once per dataset. `missing`: the reason when `other` is None.
    `target`: what the results (restricted to it) are, for the reader; `unit`: what a key of
    the results is ("dataset", "target")."""
    for name in (reference, other):
        if name is None:
            return Difference(label, reference, None, reason=missing, target=target)
        if not results.get(name):
            reasons = failed.get(name, {})
            return Difference(label, reference, other, target=target, reason=(
                f"{name} has no results" if not reasons else
                f"{name} failed on every {unit} ({_first_reasons(reasons)})"))
    pairing = pair_seeds(results[reference], results[other], score,
                         other_is_single=other in single, names=(reference, other),
                         failed=(failed.get(reference, {}), failed.get(other, {})))
    if not pairing.differences:
        return Difference(label, reference, other, pairing=pairing, target=target,
                          reason=f"{reference} and {other} share no ({unit}, seed) pair")
    return Difference(label, reference, other, paired_bootstrap(pairing.differences, resamples,
                                                                seed), pairing, target=target)


def _first_reasons(reasons: dict[str, str], shown: int = 2) -> str:
    items = [f"{dataset}: {why}" for dataset, why in reasons.items()]
    more = f"; {len(items) - shown} more" if len(items) > shown else ""
    return "; ".join(items[:shown]) + more
