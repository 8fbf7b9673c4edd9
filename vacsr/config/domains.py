"""The value domains a search space is made of (data, not behaviour): a sweep kind's space and
each method's (vacsr/methods/) name their searched config keys with these. vacsr/sweep/spec/space.py
turns them into Optuna suggestions and checks them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class _Range:
    """The closed range [low, high] a key is drawn from."""
    low: float
    high: float


@dataclass(frozen=True)
class LogFloat(_Range):
    """A float drawn on a log scale (learning rates, weight decay)."""


@dataclass(frozen=True)
class Float(_Range):
    """A float drawn uniformly."""


@dataclass(frozen=True)
class Int(_Range):
    """An integer drawn uniformly, both ends included."""


@dataclass(frozen=True)
class Choice:
    options: tuple


Domain = Union[LogFloat, Float, Int, Choice]
