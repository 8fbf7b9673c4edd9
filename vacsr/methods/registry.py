"""Every method a config's `adapter.kind` or a sweep's `--methods` can name. A new method is a
module in this package declaring a `METHOD` (vacsr/methods/method.py), and its line here."""
from __future__ import annotations

from vacsr.errors import ConfigError
from vacsr.methods import (
    clip_adapter,
    clip_contrastive,
    coop,
    linear_probe,
    sigmoid_baseline,
    vacsr_adapter,
    zero_shot,
)
from vacsr.methods.method import Method

METHODS: dict[str, Method] = {m.name: m for m in (
    vacsr_adapter.METHOD,
    sigmoid_baseline.METHOD,
    zero_shot.METHOD,
    linear_probe.METHOD,
    clip_adapter.METHOD,
    coop.METHOD,
    clip_contrastive.METHOD,
)}


def method_of(name: str) -> Method:
    """The method `name` (a config's adapter.kind) names; one line naming those that exist."""
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"adapter.kind: unknown method {name!r}; the methods are "
                          f"{', '.join(METHODS)}") from None
