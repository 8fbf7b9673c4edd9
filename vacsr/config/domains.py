"""The value domains a search space is made of (data, not behaviour): a sweep kind's space and
each method's (vacsr/methods/) name their searched config keys with these. vacsr/sweep/spec/space.py
turns them into Optuna suggestions and checks them.

A domain may be drawn only under a condition (`when`): (another searched key, its value). A
trial that draws another value for that key does not draw this one, and its run keeps the
config's value, which then does nothing (CoOp's count of random context vectors under a phrase
init: the phrase sets the count). TPE models such a key on the trials that drew it (Optuna's
define-by-run conditional search spaces).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional, Union

Condition = Optional[tuple[str, Any]]  # (key, value): drawn only where `key` has `value`


def _shown(domain) -> str:
    """The dataclass's repr without an unset condition: a space recorded before conditions
    existed (a sweep folder's settings) reads the same today."""
    parts = [f"{f.name}={getattr(domain, f.name)!r}" for f in fields(domain)
             if not (f.name == "when" and domain.when is None)]
    return f"{type(domain).__name__}({', '.join(parts)})"


@dataclass(frozen=True, repr=False)
class _Range:
    """The closed range [low, high] a key is drawn from."""
    low: float
    high: float
    when: Condition = None

    __repr__ = _shown


@dataclass(frozen=True, repr=False)
class LogFloat(_Range):
    """A float drawn on a log scale (learning rates, weight decay)."""


@dataclass(frozen=True, repr=False)
class Float(_Range):
    """A float drawn uniformly."""


@dataclass(frozen=True, repr=False)
class Int(_Range):
    """An integer drawn uniformly, both ends included."""


@dataclass(frozen=True, repr=False)
class Choice:
    options: tuple
    when: Condition = None

    __repr__ = _shown


Domain = Union[LogFloat, Float, Int, Choice]
