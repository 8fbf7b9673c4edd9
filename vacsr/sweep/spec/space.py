"""Search spaces as data: every key is a config key (the kinds in sweeps/*.py hold the ranges).

A space is data (ranges and choices); `suggest` turns it into Optuna suggestions inside a
define-by-run function, `validate_space` rejects empty or inverted ranges and `check_space_values`
values a dataset's runs would refuse, all before Ray starts.
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Collection, Mapping

from vacsr.config import Config, flatten, set_value, validate
from vacsr.config.domains import Choice, Domain, Float, Int, LogFloat
from vacsr.errors import ConfigError


def fixed_by(protocol: Mapping[str, Any], user: Mapping[str, Any],
             kind: str) -> dict[str, str]:
    """Every fixed key -> why a range on it is refused: the kind's protocol (paper appendix C.2),
    then the user's --set (whose value wins over the protocol's). A fixed key is never searched:
    every trial and final run of the sweep has its value."""
    fixed = {key: f"the {kind} protocol fixes it (paper appendix C.2), and a fixed key is never "
                  "searched; --set gives it another value" for key in protocol}
    fixed.update({key: "--set fixes it, and a fixed key is never searched; give one of the two"
                  for key in user})
    return fixed


def check_free_ranges(ranges: Mapping[str, Domain], fixed: Mapping[str, str]) -> None:
    """The user's --range on a fixed key: one line, not a range silently dropped."""
    for key in ranges:
        if key in fixed:
            raise ConfigError(f"--range {key}: {fixed[key]}")


def dataset_space(space: Mapping[str, Domain], batch_sizes: tuple[int, ...] = (),
                  overrides: dict[str, Domain] | None = None, workers: int = 1,
                  dataset: str = "", fixed: Collection[str] = (),
                  config: Config | None = None) -> dict[str, Domain]:
    """What one dataset's trials search, the one answer every reader of the searched keys takes
    (Optuna, the cost plan, the importance analysis, the MLflow view, the resume check): a
    kind's space and its batch-size choices (only sizes that split evenly over `workers`), then
    the ranges (a range on a conditional key keeps its condition), less the `fixed` keys
    (`fixed_by`), the conditions on those resolved by `config`'s values; checked."""
    space = dict(space)
    if batch_sizes and "train.batch_size" not in {*(overrides or {}), *fixed}:
        even = tuple(s for s in batch_sizes if s % max(workers, 1) == 0)
        if not even:
            raise ConfigError(f"train.batch_size: none of {dataset}'s batch sizes {batch_sizes} "
                              f"is a multiple of train.workers ({workers}); pass --range "
                              "train.batch_size=choice:...")
        space["train.batch_size"] = Choice(even)
    for key, domain in (overrides or {}).items():
        before = space.get(key)
        keeps = before is not None and before.when is not None and domain.when is None
        space[key] = replace(domain, when=before.when) if keeps else domain
    space = {key: domain for key, domain in space.items() if key not in fixed}
    if config is not None:
        space = resolve_conditions(space, config)
    validate_space(space)
    return space


def validate_space(space: dict[str, Domain]) -> None:
    """Unknown keys, empty choices and empty or inverted ranges -> ConfigError naming the key;
    a condition on a key the space does not draw unconditionally, among its choices."""
    probe = Config()
    for key, domain in space.items():
        _check_condition(space, key, domain)
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
                raise ConfigError(f"search space {key}: a log range needs low > 0, "
                                  f"got {domain.low}")
            sample = domain.low
        set_value(probe, key, sample)  # raises for keys that are not config keys


def _check_condition(space: Mapping[str, Domain], key: str, domain: Domain) -> None:
    if domain.when is None:
        return
    on, value = domain.when
    found = space.get(on)
    if not (isinstance(found, Choice) and found.when is None and value in found.options):
        raise ConfigError(f"search space {key}: drawn when {on}={value!r}, which the space does "
                          f"not draw (expected {on} searched as a choice among which "
                          f"{value!r} is, itself drawn always)")


def active(domain: Domain, values: Mapping[str, Any]) -> bool:
    """Whether a trial with these (flat) values draws `domain`: always, or where its condition
    holds."""
    return domain.when is None or values.get(domain.when[0]) == domain.when[1]


def active_keys(space: Mapping[str, Domain], values: Mapping[str, Any]) -> list[str]:
    """The keys of `space` that a run with these (flat) values drew: what was chosen for it.
    The others kept the config's value, which does nothing there."""
    return [key for key, domain in space.items() if active(domain, values)]


def resolve_conditions(space: Mapping[str, Domain], config: Config) -> dict[str, Domain]:
    """A condition on a key the space does not search (--set, a protocol) holds or fails for
    every trial alike: the domain is then drawn always, or left out (it would vary nothing)."""
    values, resolved = flatten(config), {}
    for key, domain in space.items():
        if domain.when is not None and domain.when[0] not in space:
            if not active(domain, values):
                continue
            domain = replace(domain, when=None)
        resolved[key] = domain
    return resolved


def bounding_values(domain: Domain) -> tuple:
    """The values that stand for all a domain can produce: every choice, or both ends of a range
    (the config's checks are bounds and sets, so a range's inner values pass when its ends do)."""
    if isinstance(domain, Choice):
        return domain.options
    return (domain.low, domain.high)


def check_space_values(space: dict[str, Domain], base: Config, dataset: str) -> None:
    """Every value a trial of `dataset` can be given, checked against its config key on the
    dataset's base config (`validate`): a refused value fails the sweep before Ray starts, not
    every trial that draws it."""
    for key, domain in space.items():
        for value in bounding_values(domain):
            config = copy.deepcopy(base)
            try:
                set_value(config, key, value)
                validate(config)
            except ConfigError as exc:
                raise ConfigError(f"search space {key} of {dataset} can draw {value!r}, which its "
                                  f"runs refuse ({exc})") from None


def parse_range(text: str) -> tuple[str, Domain]:
    """`loss.beta=log:0.1:10`, `train.epochs=int:1:3`, `adapter.num_components=choice:1,2`."""
    try:
        key, spec = text.split("=", 1)
        form, _, rest = spec.partition(":")
        if form == "choice":
            return key, Choice(tuple(_number(v) for v in rest.split(",") if v != ""))
        low, high = rest.split(":")
        if form == "log":
            return key, LogFloat(float(low), float(high))
        if form == "float":
            return key, Float(float(low), float(high))
        if form == "int":
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
    """Optuna suggestions for every key of `space` (used inside a define-by-run function): the
    keys drawn always first, in the space's order, then those whose condition the drawn values
    meet."""
    values: dict[str, Any] = {}
    ordered = sorted(space.items(), key=lambda item: item[1].when is not None)
    for key, domain in ordered:
        if not active(domain, values):
            continue
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
    """A picklable define-by-run space for OptunaStudySearch (the searcher state is pickled)."""

    def __init__(self, space: dict[str, Domain]) -> None:
        self.space = space

    def __call__(self, trial) -> None:
        suggest(trial, self.space)


def start_point(space: dict[str, Domain], config: Config) -> dict[str, Any]:
    """The base config's own values of the searched keys, clamped into the space: the first trial
    every search runs (the paper's defaults, appendix E, or the embedded profile's), so a short
    search never does worse than them on the selection split. A key --set fixes is not in the
    space: it never seeds a trial alone."""
    values = flatten(config)
    point = {}
    for key, domain in space.items():
        value = values[key]
        if isinstance(domain, Choice):
            point[key] = value if value in domain.options else domain.options[0]
        else:
            point[key] = type(domain.low)(min(max(value, domain.low), domain.high))
    return {key: value for key, value in point.items() if active(space[key], point)}


def tower_depths(model_name: str) -> tuple[int, int] | None:
    """(image blocks, text blocks) of an open_clip model config; None when the name is unknown
    (a local architecture open_clip resolves later). The configs are read as files (vacsr's own,
    then those open_clip ships): open_clip loads only for names only it resolves (hf-hub:)."""
    from vacsr.model.configs import model_config

    config = model_config(model_name)
    if config is None:
        import open_clip

        config = open_clip.get_model_config(model_name)
    if not config:
        return None
    return int(config["vision_cfg"]["layers"]), int(config["text_cfg"]["layers"])


BLOCK_KEYS = ("model.trainable_image_blocks", "model.trainable_text_blocks")


def clamp_blocks(space: dict[str, Domain], depths: tuple[int, int] | None) -> dict[str, Domain]:
    """Trainable-block ranges cut to the backbone's depth (a 3-block model cannot train 4)."""
    result = dict(space)
    for key, depth in zip(BLOCK_KEYS, depths or ()):
        if isinstance(result.get(key), Int):
            result[key] = replace(result[key], low=min(result[key].low, depth),
                                  high=min(result[key].high, depth))
    return result


def check_blocks(config: Config, depths: tuple[int, int] | None, dataset: str) -> None:
    """A fixed trainable-block count (--set, a protocol) deeper than its tower: one line before
    Ray starts, not a failure in every trial."""
    values = flatten(config)
    for key, depth, tower in zip(BLOCK_KEYS, depths or (), ("image", "text")):
        if values[key] > depth:
            raise ConfigError(f"{key}: {values[key]} exceeds the {depth} blocks of the {tower} "
                              f"tower of {config.model.name} ({dataset})")
