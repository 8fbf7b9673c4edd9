"""A sweep's peak memory per worker against its device's, checked once: before anything is
written when `--device-memory-gib` gives the device's memory (`refuse_unfit`, called by the
command line), else in the cost estimate once the calibration has measured the GPU
(vacsr/sweep/cost/sweep_cost.py). The estimate itself is vacsr/model/memory.py's.
"""
from __future__ import annotations

import copy

from vacsr.config import flatten, set_value
from vacsr.errors import ConfigError
from vacsr.methods.registry import method_of
from vacsr.sweep.cost import estimate as est
from vacsr.sweep.cost.counts import step_prompts
from vacsr.sweep.plan.plan import SweepPlan

GIB = 2 ** 30


def _most(key: str, values: tuple):
    """The value of a cost key that needs the most memory: side first (activations of every
    block kept), -1 blocks (all), else the largest."""
    if key == "model.trainable_side":
        return "first" if "first" in values else values[0]
    return -1 if -1 in values else max(values)


def _least(key: str, values: tuple):
    if key == "model.trainable_side":
        return "last" if "last" in values else values[0]
    return min(values, key=lambda v: float("inf") if v == -1 else v)


def _peak(config, settings: dict, prompts: int) -> int:
    """Estimated peak bytes per worker of `config` with `settings` (key -> value) set."""
    from vacsr.model.memory import estimate_for_config, towers

    config = copy.deepcopy(config)
    for key, value in settings.items():
        set_value(config, key, value)
    image, text, _ = towers(config.model.name)  # the estimate's own towers, hooked ones included
    depths = (image.layers, text.layers)
    method = method_of(config.adapter.kind)
    hooked = est.hooked_blocks_of(flatten(config), depths)
    if method.encodes_prompts:  # the gradient crosses the text tower to the prompts' context
        hooked = (hooked[0], depths[1])
    texts = prompts or None
    if method.conditions_prompts:  # every image's own class prompts (CoCoOp)
        texts = prompts * (config.train.batch_size // max(config.train.workers, 1))
    return estimate_for_config(config, texts=texts, hooked=hooked)["total"]


def worst_memory(plan: SweepPlan, dataset: str, prompts: int | None = None,
                 ) -> tuple[str, object, int]:
    """(bounding key, its value, peak bytes per worker) of the largest configuration the
    dataset's space draws: each cost key at its most. The bounding key is the searched key whose
    own least value lowers that peak the most (narrowing it helps most); with none searched that
    lowers it, the batch size. `prompts`: the classes a step encodes, as counted; None before
    the datasets are counted (the dataset's full class count, an upper bound)."""
    space, base = plan.spaces[dataset], plan.configs[dataset]
    flat = flatten(base)
    if prompts is None:
        prompts = step_prompts(plan.kind, plan.dataset_of(dataset))
    values = {key: est.values_of(space.get(key), flat[key]) for key in est.COST_KEYS}
    worst = {key: _most(key, v) for key, v in values.items()}
    peak = _peak(base, worst, prompts)
    savings = {key: peak - _peak(base, {**worst, key: _least(key, v)}, prompts)
               for key, v in values.items() if len(v) > 1}
    key = max(savings, key=savings.get) if savings and max(savings.values()) > 0 \
        else "train.batch_size"
    return key, worst[key], peak


def memory_peaks(plan: SweepPlan, prompts: dict[str, int] | None = None,
                 ) -> dict[str, tuple[str, object, float]]:
    """Dataset -> (bounding key, value, estimated peak GiB per worker); `prompts`: dataset ->
    its counted step prompts (DatasetCounts.prompts), where counted."""
    peaks = {}
    for dataset in plan.datasets:
        key, value, peak = worst_memory(plan, dataset, (prompts or {}).get(dataset))
        peaks[dataset] = (key, value, peak / GIB)
    return peaks


def comparable(peak: float, device: float) -> tuple[str, str]:
    """Both figures with the fewest significant digits (2 at least) that show peak > device."""
    for digits in range(2, 10):
        shown = f"{peak:.{digits}g}", f"{device:.{digits}g}"
        if float(shown[0]) > float(shown[1]):
            return shown
    return repr(peak), repr(device)


def check_memory(plan: SweepPlan, peaks: dict[str, tuple[str, object, float]],
                 device_gib: float) -> None:
    """Refuse the sweep in one line when a dataset's largest configuration cannot fit."""
    for dataset, (key, value, peak) in peaks.items():
        if peak <= device_gib:
            continue
        m = plan.configs[dataset].model
        need, have = comparable(peak, device_gib)
        searched = key in plan.spaces[dataset]
        fix = (f"narrow it with --range {key}=choice:..." if searched
               else f"lower it with --set {key}=...")
        raise ConfigError(
            f"{dataset}: {key}={value} needs an estimated {need} GiB per worker (model {m.name}, "
            f"the most blocks, batch and side the space allows), more than the device's {have} "
            f"GiB; {fix} or more --workers")


def refuse_unfit(plan: SweepPlan) -> None:
    """The command line's check: with `--device-memory-gib` known, before anything is written
    (without it the cost estimate checks against the calibration's GPU)."""
    if plan.device_memory_gib is not None:
        check_memory(plan, memory_peaks(plan), plan.device_memory_gib)
