"""A dataset's search and final phase in device-seconds, composed from measured per-input costs
(vacsr/sweep/plan/calibrate.py) and the counts a run reads (vacsr/sweep/plan/counts.py).

A configuration's training step (B images, P prompts, tower depths L_i, L_t):

    step = B (load + f_i + b_i path_i) + P_t (f_t' + b_t path_t) + h B P
    path = L - F, F the frozen prefix's blocks (vacsr/model/frozen.py, the backbone's own rule:
    L - N for side last, L for N = 0, else 0; the plain CLIP towers the calibration times split)

P_t is the prompts encoded each step (classification: the classes, only while a text block trains,
else they are encoded once per run; retrieval: the batch's B captions). The prompts' frozen
prefix runs once per run, so f_t' = f_t (L - F) / L. An epoch is train // B steps (the last
partial batch is dropped) and one val pass (val images x (load + f_i), or after the first pass
f_i (L - F) / L: the prefix comes from the cache). A dataset's search adds one start-up
and teardown (its trials reuse one actor; runs of 2+ Train workers start their own, each trial a
start-up), its final runs another start-up.

The search's epochs follow ASHA as the sweep configures it (RecordingASHA: grace period 1,
reduction factor 4, milestones 1, 4, 16... below the largest epoch count + 1, trials one after
the other): the expected epochs come from simulating it with trials of independent, fixed rank
(`asha_epochs`); the upper bound is no stopping.
"""
from __future__ import annotations

import itertools
import random
import statistics
from dataclasses import dataclass

from vacsr.model.frozen import frozen_blocks, gradient_blocks
from vacsr.sweep.plan.calibrate import StepCosts
from vacsr.sweep.plan.counts import DatasetCounts
from vacsr.sweep.spec.space import Choice, Domain, Int

ASHA_GRACE, ASHA_REDUCTION = 1, 4  # as vacsr/sweep/search/tune.py configures RecordingASHA
SIMULATIONS = 2000  # ASHA runs averaged for the expected stopping (seeded: the same each time)
COST_KEYS = ("train.batch_size", "model.trainable_side", "model.trainable_image_blocks",
             "model.trainable_text_blocks", "model.train_embeddings")


@dataclass(frozen=True)
class Shape:
    """The cost-relevant values of one configuration."""

    batch_size: int
    side: str
    image_blocks: int  # -1: all
    text_blocks: int
    embeddings: bool = False  # model.train_embeddings


def values_of(domain: Domain | None, fixed) -> tuple:
    """The values a key takes: an Int's every integer, a Choice's options, else the config's."""
    if isinstance(domain, Int):
        return tuple(range(domain.low, domain.high + 1))
    if isinstance(domain, Choice):
        return tuple(domain.options)
    return (fixed,)


def path_blocks(blocks: int, depth: int, side: str, embeddings: bool = False) -> int:
    """Blocks the backward pass crosses: all above the frozen prefix (vacsr/model/frozen.py)."""
    return gradient_blocks(side, blocks, depth, embeddings_trainable=embeddings)


def step_seconds(shape: Shape, costs: StepCosts, prompts: int, depths: tuple[int, int]) -> float:
    """One training step of `shape` (module docstring)."""
    b = shape.batch_size
    image = b * (costs.image_load + costs.image_forward
                 + costs.image_backward_block * path_blocks(shape.image_blocks, depths[0],
                                                            shape.side, shape.embeddings))
    texts = prompts or b  # retrieval: the batch's captions
    text_path = path_blocks(shape.text_blocks, depths[1], shape.side, shape.embeddings)
    if prompts and text_path == 0:  # frozen prompts: encoded once per run (run_seconds)
        text = 0.0
    else:
        share = _share(shape, 1, depths[1]) if prompts else 1.0
        text = texts * (costs.text_forward * share + costs.text_backward_block * text_path)
    return image + text + costs.head_pair * b * texts


def _share(shape: Shape, tower: int, depth: int) -> float:
    """The part of tower `tower` (0 image, 1 text) above its frozen prefix, run every pass."""
    blocks = (shape.image_blocks, shape.text_blocks)[tower]
    return 1 - frozen_blocks(shape.side, blocks, depth,
                             embeddings_trainable=shape.embeddings) / depth


def epoch_seconds(shape: Shape, costs: StepCosts, counts: DatasetCounts,
                  depths: tuple[int, int], cached: bool) -> float:
    """Training steps plus a val pass; `cached`: the val pass's frozen prefix is in the cache."""
    steps = counts.train // shape.batch_size
    per_image = costs.image_load + costs.image_forward
    if cached and (share := _share(shape, 0, depths[0])) < 1:
        per_image = costs.image_forward * share
    val = counts.val * per_image + counts.prompts * costs.text_forward
    return steps * step_seconds(shape, costs, counts.prompts, depths) + val


def run_seconds(shape: Shape, epochs: float, costs: StepCosts, counts: DatasetCounts,
                depths: tuple[int, int]) -> float:
    """A trial (or a final run) of `epochs` epochs, once-per-run prompts included (the start-up
    is the dataset's: trials reuse the actor)."""
    if epochs <= 0:
        return 0.0
    first = epoch_seconds(shape, costs, counts, depths, cached=False)
    rest = epoch_seconds(shape, costs, counts, depths, cached=True)
    return counts.prompts * costs.text_forward + first + (epochs - 1) * rest


def shapes(space: dict[str, Domain], base: dict) -> list[Shape]:
    """Every combination of the cost-relevant keys the space draws (base: flat config values)."""
    grids = [values_of(space.get(key), base[key]) for key in COST_KEYS]
    return [Shape(*combo) for combo in itertools.product(*grids)]


def asha_milestones(max_epochs: int) -> list[int]:
    milestones, milestone = [], ASHA_GRACE
    while milestone < max_epochs + 1:  # tune.py: max_t = max epochs + 1
        milestones.append(milestone)
        milestone *= ASHA_REDUCTION
    return milestones


def _cutoff(recorded: list[float]) -> float | None:
    """Ray's ASHA cutoff: the (1 - 1/rf) percentile of the rung's results, linear interpolation."""
    if not recorded:
        return None
    ordered = sorted(recorded)
    at = (1 - 1 / ASHA_REDUCTION) * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (at - low) * (ordered[high] - ordered[low])


def asha_epochs(epochs: list[tuple[int, ...]], max_epochs: int,
                simulations: int = SIMULATIONS) -> list[float]:
    """Expected epochs each trial runs under ASHA, trials in order; `epochs[i]`: the epoch
    counts trial i may draw (uniformly). Each trial's rank is fixed over its epochs."""
    milestones = asha_milestones(max_epochs)
    rng = random.Random(0)
    totals = [0.0] * len(epochs)
    for _ in range(simulations):
        rungs: dict[int, list[float]] = {m: [] for m in milestones}
        for index, choices in enumerate(epochs):
            own, quality = rng.choice(choices), rng.random()
            ran = own
            for milestone in milestones:
                if milestone > own:
                    break
                cutoff = _cutoff(rungs[milestone])
                rungs[milestone].append(quality)
                if cutoff is not None and quality < cutoff:
                    ran = milestone
                    break
            totals[index] += ran
    return [total / simulations for total in totals]


def mean_run_seconds(grid: list[Shape], epochs: float, costs: StepCosts, counts: DatasetCounts,
                     depths: tuple[int, int]) -> float:
    return statistics.fmean(run_seconds(s, epochs, costs, counts, depths) for s in grid)
