"""Search spaces of the sweeps, in one place; every key is a config key (paper appendix C.2, E).

A space is data (ranges and choices); `suggest` turns it into Optuna suggestions inside a
define-by-run function, and `validate_space` rejects empty or inverted ranges before any trial.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Union

from vacsr.config import Config, flatten, set_value
from vacsr.errors import ConfigError


@dataclass(frozen=True)
class LogFloat:
    low: float
    high: float


@dataclass(frozen=True)
class Float:
    low: float
    high: float


@dataclass(frozen=True)
class Int:
    low: int
    high: int


@dataclass(frozen=True)
class Choice:
    options: tuple


Domain = Union[LogFloat, Float, Int, Choice]

# Per-dataset batch sizes (paper C.2: 128 for SUN397, 5 for EuroSAT; the rest in between).
BATCH_SIZES: dict[str, tuple[int, ...]] = {
    "imagenet": (64, 128), "caltech101": (16, 32), "oxford_pets": (16, 32),
    "stanford_cars": (16, 32), "oxford_flowers": (16, 32), "food101": (16, 32),
    "fgvc_aircraft": (16, 32), "sun397": (64, 128), "dtd": (16, 32), "eurosat": (4, 5, 6),
    "ucf101": (16, 32),
}

_ADAPTER_SPACE: dict[str, Domain] = {
    "loss.alpha_kl": LogFloat(1e-5, 1e-2),
    "loss.beta": LogFloat(0.1, 10.0),
    "loss.gamma": LogFloat(0.1, 10.0),
    "adapter.num_components": Choice((1, 2, 3, 4)),
    "loss.num_hard_negatives": Choice((1, 2, 4, 8)),
    # appendix E.1 says the negatives' variance term "still uses positive labels": searched
    "loss.neg_sigma_target": Choice(("label", "positive")),
}

SPACES: dict[str, dict[str, Domain]] = {
    "base2novel": {**_ADAPTER_SPACE,
                   "model.trainable_image_blocks": Int(0, 4),
                   "model.trainable_text_blocks": Int(0, 4),
                   "train.epochs": Int(2, 10),
                   "optim.lr": LogFloat(1e-4, 3e-3)},
    # trainable blocks and epochs are fixed by the DG protocol (appendix C.2; sweep/cli.py KINDS)
    "domain_generalization": {**_ADAPTER_SPACE, "optim.lr": LogFloat(1e-4, 3e-3)},
    "retrieval": {**_ADAPTER_SPACE,
                  "optim.lr": LogFloat(1e-4, 1e-3),
                  "optim.backbone_lr_mult": LogFloat(0.01, 0.3)},
}


def space_for(kind: str, dataset: str | None = None, overrides: dict[str, Domain] | None = None,
              batch_sizes: tuple[int, ...] | None = None, workers: int = 1) -> dict[str, Domain]:
    """The space of a sweep kind, with the dataset's batch-size list (only sizes that split evenly
    over `workers`) and user overrides."""
    if kind not in SPACES:
        raise ConfigError(f"sweep kind {kind!r}: expected one of {', '.join(SPACES)}")
    space = dict(SPACES[kind])
    sizes = batch_sizes or BATCH_SIZES.get(dataset or "", ())
    if sizes and "train.batch_size" not in (overrides or {}):
        even = tuple(s for s in sizes if s % max(workers, 1) == 0)
        if not even:
            raise ConfigError(f"train.batch_size: none of {dataset}'s batch sizes {sizes} is a "
                              f"multiple of train.workers ({workers}); pass --range "
                              "train.batch_size=choice:...")
        space["train.batch_size"] = Choice(even)
    space.update(overrides or {})
    validate_space(space)
    return space


def validate_space(space: dict[str, Domain]) -> None:
    """Unknown keys, empty choices and empty or inverted ranges -> ConfigError naming the key."""
    probe = Config()
    for key, domain in space.items():
        if isinstance(domain, Choice):
            if not domain.options:
                raise ConfigError(f"search space {key}: empty list of choices")
            sample = domain.options[0]
        else:
            if not domain.low < domain.high and not (isinstance(domain, Int)
                                                     and domain.low == domain.high):
                raise ConfigError(f"search space {key}: empty or inverted range "
                                  f"[{domain.low}, {domain.high}]")
            if isinstance(domain, LogFloat) and domain.low <= 0:
                raise ConfigError(f"search space {key}: a log range needs low > 0, got {domain.low}")
            sample = domain.low
        set_value(probe, key, sample)  # raises for keys that are not config keys


def parse_range(text: str) -> tuple[str, Domain]:
    """`loss.beta=log:0.1:10`, `train.epochs=int:1:3`, `adapter.num_components=choice:1,2`."""
    try:
        key, spec = text.split("=", 1)
        kind, _, rest = spec.partition(":")
        if kind == "choice":
            return key, Choice(tuple(_number(v) for v in rest.split(",") if v != ""))
        low, high = rest.split(":")
        if kind == "log":
            return key, LogFloat(float(low), float(high))
        if kind == "float":
            return key, Float(float(low), float(high))
        if kind == "int":
            return key, Int(int(low), int(high))
    except ValueError:
        pass
    raise ConfigError(f"search range {text!r}: expected key=log:LOW:HIGH, key=float:LOW:HIGH, "
                      "key=int:LOW:HIGH or key=choice:A,B,...")


def _number(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def suggest(trial, space: dict[str, Domain]) -> dict[str, Any]:
    """Optuna suggestions for every key of `space` (used inside a define-by-run function)."""
    values = {}
    for key, domain in space.items():
        if isinstance(domain, LogFloat):
            values[key] = trial.suggest_float(key, domain.low, domain.high, log=True)
        elif isinstance(domain, Float):
            values[key] = trial.suggest_float(key, domain.low, domain.high)
        elif isinstance(domain, Int):
            values[key] = trial.suggest_int(key, domain.low, domain.high)
        else:
            values[key] = trial.suggest_categorical(key, list(domain.options))
    return values


class DefineByRun:
    """A picklable define-by-run space for OptunaSearch (the searcher state is pickled)."""

    def __init__(self, space: dict[str, Domain]) -> None:
        self.space = space

    def __call__(self, trial) -> None:
        suggest(trial, self.space)


def start_point(space: dict[str, Domain], config: Config) -> dict[str, Any]:
    """The base config's own values of the searched keys, clamped into the space: the first trial
    every search runs (the paper's defaults, appendix E), so a short search never does worse than
    them on the selection split."""
    values = flatten(config)
    point = {}
    for key, domain in space.items():
        value = values[key]
        if isinstance(domain, Choice):
            point[key] = value if value in domain.options else domain.options[0]
        else:
            point[key] = type(domain.low)(min(max(value, domain.low), domain.high))
    return point


def clamp_blocks(space: dict[str, Domain], image_depth: int, text_depth: int) -> dict[str, Domain]:
    """Trainable-block ranges cut to the backbone's depth (the tiny model has 3 blocks)."""
    result = dict(space)
    for key, depth in (("model.trainable_image_blocks", image_depth),
                       ("model.trainable_text_blocks", text_depth)):
        if isinstance(result.get(key), Int):
            result[key] = replace(result[key], low=min(result[key].low, depth),
                                  high=min(result[key].high, depth))
    return result
