"""A dataset's search and final phase in device-seconds, composed from measured per-input costs
(vacsr/sweep/cost/calibrate.py) and the counts a run reads (vacsr/sweep/cost/counts.py).

A configuration's training step (B images, P prompts, tower depths L_i, L_t):

    step = B (load + f_i + b_i back_i) + P_t (f_t' + b_t back_t) + h B P
    path = L - F, F the frozen prefix's blocks (vacsr/model/frozen.py, the backbone's own rule:
    L - N for side last, L for N = 0, else 0; the plain CLIP towers the calibration times split)
    back = n + (path - n) / 2, n the trainable blocks on the path: a frozen block the gradient
    crosses computes its input's gradient alone, half a trainable block's backward

P_t is the prompts encoded each step (classification: the classes, only while a text block trains,
else they are encoded once per run; retrieval: the batch's B captions). What the run's method
(`adapter.kind`, vacsr/methods/) declares changes the step: a method whose image tower is frozen
whole trains on each training image's feature computed once per run (B (load + f_i) leaves the
step; train (load + f_i) is paid once, as the run starts), one whose head encodes the prompts
itself sends the P prompts through the whole text tower and back to its input every step
(P (f_t + b_t L_t / 2): CoOp's context sits before the first block), one whose prompts are
conditioned on each image does so for every image's own P prompts (B P of them each step, and
val x P at the val pass: CoCoOp's meta-net), one that hooks the towers
ends their frozen prefix at its lowest hook (path and share follow, MMA's adapters), and one that
trains nothing takes no step (its epoch is the val pass). The prompts' frozen
prefix runs once per run, so f_t' = f_t (L - F) / L. An epoch is train // B steps (the last
partial batch is dropped) and one val pass (val images x (load + f_i), or after the first pass
f_i (L - F) / L: the prefix comes from the cache). A dataset's search adds one start-up
and teardown (its trials reuse one actor; runs of 2+ Train workers start their own, each trial a
start-up), its final runs another start-up.

The search's epochs follow ASHA as the sweep configures it (vacsr/sweep/spec/schedule.py, the
schedule the sweep's OrderedASHA decides on: rungs at the grace period times powers of the
reduction factor, below the largest epoch count + 1; trials one after the other): the expected
epochs come from simulating it with trials of independent, fixed rank (`asha_epochs`); the upper
bound is no stopping.
"""
from __future__ import annotations

import itertools
import random
import statistics
from dataclasses import dataclass

from vacsr.config import DEFAULT_METHOD
from vacsr.methods.method import METHOD_KEY, Method
from vacsr.methods.registry import method_of
from vacsr.model.frozen import frozen_blocks, gradient_blocks
from vacsr.model.prompt_room import prompt_length
from vacsr.sweep.cost.calibrate import StepCosts
from vacsr.sweep.cost.counts import DatasetCounts
from vacsr.sweep.spec.schedule import ASHA
from vacsr.sweep.spec.space import Choice, Domain, Int

SIMULATIONS = 2000  # ASHA runs averaged for the expected stopping (seeded: the same each time)
# a frozen block's backward next to a trainable one's, which the calibration times: it computes
# its input's gradient alone, one of the two matmuls of each linear layer's backward (no weight
# gradient). bench_method_costs.py's prompt and deep methods, whose paths are frozen blocks,
# measured 0.66-0.73 of the estimate that charged them whole
FROZEN_BACKWARD = 0.5
COST_KEYS = ("train.batch_size", "model.trainable_side", "model.trainable_image_blocks",
             "model.trainable_text_blocks", "model.train_embeddings")


@dataclass(frozen=True)
class RunSettings:
    """The config values of one run that its cost depends on (COST_KEYS, in that order), and
    its method (`adapter.kind`: fixed per unit, never searched)."""

    batch_size: int
    side: str
    image_blocks: int  # -1: all
    text_blocks: int
    embeddings: bool = False  # model.train_embeddings
    kind: str = DEFAULT_METHOD
    # a deep method's blocks from its lowest hook to the top, image and text tower
    # (Method.hooked_blocks; 0: none)
    hooked: tuple[int, int] = (0, 0)

    @property
    def method(self) -> Method:
        return method_of(self.kind)

    def first_hook(self, tower: int, depth: int) -> int | None:
        """The lowest hooked block of tower `tower` (0 image, 1 text) of `depth` blocks (None:
        no hook)."""
        return depth - self.hooked[tower] if self.hooked[tower] else None


def hooked_blocks_of(values, depths: tuple[int, int]) -> tuple[int, int]:
    """A run's deep method's blocks from its lowest hook to the top of each tower ((0, 0): it
    hooks none); a setting the towers cannot hold is one ConfigError line."""
    method = method_of(values[METHOD_KEY])
    if method.hooked_blocks is None:
        return (0, 0)
    image, text = (method.hooked_blocks(values, depth) for depth in depths)
    return image, text


def run_settings(values, depths: tuple[int, int]) -> RunSettings:
    """A run's RunSettings from its flat config values and its towers' depths."""
    return RunSettings(*(values[key] for key in COST_KEYS), kind=values[METHOD_KEY],
                       hooked=hooked_blocks_of(values, depths))


def values_of(domain: Domain | None, fixed) -> tuple:
    """The values a key takes: an Int's every integer, a Choice's options, else the config's."""
    if isinstance(domain, Int):
        return tuple(range(domain.low, domain.high + 1))
    if isinstance(domain, Choice):
        return tuple(domain.options)
    return (fixed,)


def path_blocks(blocks: int, depth: int, side: str, embeddings: bool = False,
                first_hook: int | None = None) -> int:
    """Blocks the backward pass crosses: all above the frozen prefix (vacsr/model/frozen.py)."""
    return gradient_blocks(side, blocks, depth, embeddings_trainable=embeddings,
                           first_hook=first_hook)


def backward_blocks(blocks: int, depth: int, side: str, embeddings: bool = False,
                    first_hook: int | None = None, path: int | None = None) -> float:
    """The backward pass in trainable blocks' worth: each trainable block on the gradient path
    counts 1, each frozen block it crosses FROZEN_BACKWARD (a deep method's towers, a prompt's
    way back to its context, the frozen blocks above side first's trainable ones). `path`: the
    blocks crossed, where not the frozen prefix's rule (a prompt's context crosses the whole
    tower)."""
    if path is None:
        path = path_blocks(blocks, depth, side, embeddings, first_hook)
    trainable = min(depth if blocks == -1 else blocks, path)
    return trainable + FROZEN_BACKWARD * (path - trainable)


def prompt_share(inits: tuple, context_tokens: tuple, name_pieces: int,
                 positions: int | None) -> float:
    """The part of the text tower's `positions` a prompt method's class prompts run over (they
    stop at the longest one's end, vacsr/model/prefix.py prompt_end): the longest prompt any of
    the `inits` and `context_tokens` a unit draws writes, for its longest class name of
    `name_pieces` word pieces; 1 where either count is unknown."""
    if not name_pieces or positions is None:
        return 1.0
    longest = max(prompt_length(m, init, name_pieces) for init in inits for m in context_tokens)
    return min(1.0, longest / positions)


def step_seconds(run: RunSettings, costs: StepCosts, prompts: int,
                 depths: tuple[int, int], prompt_share: float = 1.0) -> float:
    """One training step of `run` (module docstring); `prompt_share`: the part of the text
    context a prompt method's prompts run over (DatasetCounts.prompt_share)."""
    b, method = run.batch_size, run.method
    image = 0.0 if method.frozen_image_tower else b * (  # features once per run: start_seconds
        costs.image_load + costs.image_forward
        + costs.image_backward_block * backward_blocks(
            run.image_blocks, depths[0], run.side, run.embeddings, run.first_hook(0, depths[0])))
    texts = prompts or b  # retrieval: the batch's captions
    pairs = b * texts
    if method.conditions_prompts:  # every image's own class prompts (CoCoOp)
        texts = b * prompts
    text_path = path_blocks(run.text_blocks, depths[1], run.side, run.embeddings,
                            run.first_hook(1, depths[1]))
    if method.encodes_prompts:  # the whole tower, and back to the context at its input
        back = backward_blocks(run.text_blocks, depths[1], run.side, path=depths[1])
        text = texts * prompt_share * (costs.text_forward + costs.text_backward_block * back)
    elif prompts and text_path == 0:  # frozen prompts: encoded once per run (start_seconds)
        text = 0.0
    else:
        share = _share(run, 1, depths[1]) if prompts else 1.0
        back = backward_blocks(run.text_blocks, depths[1], run.side, run.embeddings,
                               run.first_hook(1, depths[1]))
        text = texts * (costs.text_forward * share + costs.text_backward_block * back)
    return image + text + costs.head_pair * pairs


def _share(run: RunSettings, tower: int, depth: int) -> float:
    """The part of tower `tower` (0 image, 1 text) above its frozen prefix, run every pass."""
    blocks = (run.image_blocks, run.text_blocks)[tower]
    return 1 - frozen_blocks(run.side, blocks, depth, embeddings_trainable=run.embeddings,
                             first_hook=run.first_hook(tower, depth)) / depth


def epoch_seconds(run: RunSettings, costs: StepCosts, counts: DatasetCounts,
                  depths: tuple[int, int], cached: bool) -> float:
    """Training steps plus a val pass; `cached`: the val pass's frozen prefix is in the cache."""
    steps = counts.train // run.batch_size if run.method.trained else 0
    per_image = costs.image_load + costs.image_forward
    if cached and (share := _share(run, 0, depths[0])) < 1:
        per_image = costs.image_forward * share
    val = counts.val * per_image + prompt_texts(run.method, counts, counts.val) * costs.text_forward
    return steps * step_seconds(run, costs, counts.prompts, depths, counts.prompt_share) + val


def prompt_texts(method: Method, counts: DatasetCounts, images: int) -> float:
    """The class prompts an evaluation pass over `images` encodes, in whole prompts' worth: once,
    or once per image (CoCoOp); a prompt method's cut at its longest prompt's end."""
    texts = counts.prompts * (images if method.conditions_prompts else 1)
    return texts * (counts.prompt_share if method.encodes_prompts else 1.0)


def start_seconds(run: RunSettings, costs: StepCosts, counts: DatasetCounts) -> float:
    """What a run computes once, before its first step: the prompts' features, and with the
    image tower frozen whole the training images' (a conservative count: the dataset's prefix
    cache may already hold them from an earlier trial or method)."""
    features = (counts.train * (costs.image_load + costs.image_forward)
                if run.method.frozen_image_tower and run.method.trained else 0.0)
    return counts.prompts * costs.text_forward + features


def run_seconds(run: RunSettings, epochs: float, costs: StepCosts, counts: DatasetCounts,
                depths: tuple[int, int]) -> float:
    """A trial (or a final run) of `epochs` epochs, what it computes once included (the start-up
    is the dataset's: trials reuse the actor)."""
    if epochs <= 0:
        return 0.0
    first = epoch_seconds(run, costs, counts, depths, cached=False)
    rest = epoch_seconds(run, costs, counts, depths, cached=True)
    return start_seconds(run, costs, counts) + first + (epochs - 1) * rest


def settings_grid(space: dict[str, Domain], base: dict,
                  depths: tuple[int, int]) -> list[RunSettings]:
    """Every combination of the cost-relevant keys the space draws (base: flat config values)."""
    grids = [values_of(space.get(key), base[key]) for key in COST_KEYS]
    hooked = hooked_blocks_of(base, depths)
    return [RunSettings(*combo, kind=base[METHOD_KEY], hooked=hooked)
            for combo in itertools.product(*grids)]


def _cutoff(recorded: list[float]) -> float | None:
    """Ray's ASHA cutoff: the (1 - 1/rf) percentile of the rung's results, linear interpolation."""
    if not recorded:
        return None
    ordered = sorted(recorded)
    at = (1 - 1 / ASHA.reduction_factor) * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (at - low) * (ordered[high] - ordered[low])


def asha_search(trials: list[tuple[int, float]], max_epochs: int) -> list[int]:
    """Epochs each trial runs in one search under ASHA, trials one after the other; `trials[i]`:
    (the epochs trial i asks for, its quality: higher is better, the same at every epoch). A
    trial is compared at each rung it reaches with the qualities recorded there before it, and
    stops at the first where it falls below the cutoff."""
    rungs: dict[int, list[float]] = {m: [] for m in ASHA.rungs(max_epochs)}
    ran = []
    for own, quality in trials:
        stop = own
        for milestone, recorded in rungs.items():  # lowest first
            if milestone > own:
                break
            cutoff = _cutoff(recorded)
            recorded.append(quality)
            if cutoff is not None and quality < cutoff:
                stop = milestone
                break
        ran.append(stop)
    return ran


def asha_epochs(epochs: list[tuple[int, ...]], max_epochs: int,
                simulations: int = SIMULATIONS) -> list[float]:
    """Expected epochs each trial runs under ASHA, trials in order; `epochs[i]`: the epoch
    counts trial i may draw (uniformly). Each trial's rank is fixed over its epochs: the mean of
    `simulations` seeded searches (`asha_search`) of uniformly random qualities."""
    rng = random.Random(0)
    totals = [0.0] * len(epochs)
    for _ in range(simulations):
        trials = [(rng.choice(choices), rng.random()) for choices in epochs]
        for index, ran in enumerate(asha_search(trials, max_epochs)):
            totals[index] += ran
    return [total / simulations for total in totals]


def mean_run_seconds(grid: list[RunSettings], epochs: float, costs: StepCosts,
                     counts: DatasetCounts, depths: tuple[int, int]) -> float:
    """A run's seconds averaged over every combination the space draws (uniform draws)."""
    return statistics.fmean(run_seconds(s, epochs, costs, counts, depths) for s in grid)
