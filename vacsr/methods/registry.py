"""Every method a config's `adapter.kind` or a sweep's `--methods` can name. A new method is a
module in this package declaring a `METHOD` (vacsr/methods/method.py), and its line here."""
from __future__ import annotations

from vacsr.config import DEFAULT_METHOD
from vacsr.errors import ConfigError
from vacsr.methods import (
    clip_adapter,
    clip_contrastive,
    cocoop,
    coop,
    linear_probe,
    maple,
    mma,
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
    cocoop.METHOD,
    mma.METHOD,
    maple.METHOD,
    clip_contrastive.METHOD,
)}


# the comparison's reference (the paper's method) and its lower baseline, CLIP as it comes with
# nothing trained: a comparison report sets the first against the best other method and
# against the second (vacsr/sweep/report/comparison_rows.py)
REFERENCE = DEFAULT_METHOD
ZERO_SHOT = zero_shot.METHOD.name


def method_of(name: str) -> Method:
    """The method `name` (a config's adapter.kind) names; one line naming those that exist."""
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"adapter.kind: unknown method {name!r}; the methods are "
                          f"{', '.join(METHODS)}") from None
