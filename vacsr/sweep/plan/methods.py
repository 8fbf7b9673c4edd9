"""`--methods`: which methods a sweep runs (vacsr/methods/registry.py), each as units of its own
(one per dataset) under one budget: the same trials, seeds, epoch range, few-shot sample and
selection on the val split. Every check here runs before Ray starts."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from vacsr.config import DEFAULT_METHOD, Config, flatten, shown
from vacsr.config.domains import Choice
from vacsr.errors import ConfigError
from vacsr.methods.method import METHOD_KEY, Method
from vacsr.methods.registry import METHODS
from vacsr.sweep.plan.folders import prefix_cache_folder
from vacsr.sweep.plan.plan import build_config
from vacsr.sweep.spec.kind import SweepKind
from vacsr.sweep.spec.space import (
    Domain,
    bounding_values,
    check_blocks,
    check_space_values,
    clamp_blocks,
    dataset_space,
)

DEFAULT_METHODS = (DEFAULT_METHOD,)
ALL = "all"


def parse_methods(text: str | None, kind: SweepKind) -> tuple[str, ...]:
    """--methods a,b,c (or `all`: every method of the kind's task) -> their names, in order."""
    if text is None:
        return DEFAULT_METHODS
    names = [part.strip() for part in text.split(",") if part.strip()]
    if names == [ALL]:
        return tuple(m.name for m in METHODS.values() if kind.task in m.tasks)
    if ALL in names:
        raise ConfigError(f"--methods: {ALL!r} stands alone; give either {ALL} or a list of "
                          "methods")
    known = ", ".join(METHODS)
    for name in names:
        if name not in METHODS:
            raise ConfigError(f"--methods: unknown method {name!r}; the methods are {known} "
                              f"(or {ALL})")
        if kind.task not in METHODS[name].tasks:
            raise ConfigError(f"--methods: {name} runs on {', '.join(METHODS[name].tasks)} "
                              f"only, not the {kind.name} sweep's {kind.task}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"--methods: {', '.join(repeated)} named twice; name each once")
    if not names:
        raise ConfigError(f"--methods: expected method names ({known}) or {ALL}")
    return tuple(names)


def unit_name(dataset: str, method: str, methods: tuple[str, ...]) -> str:
    """A unit's name: the dataset's where the sweep runs one method (so a VACSR sweep's names,
    studies and records are those it always had), else `<dataset>.<method>`."""
    return dataset if len(methods) == 1 else f"{dataset}.{method}"


def kept_keys(method: Method, keys) -> list[str]:
    """Of `keys`, those a method's trials may search: its own, the kind's it keeps, and for a
    method that keeps the kind's whole space any other key no other method owns (a --range
    adds a key to the search)."""
    if not method.trained:
        return []
    others = {k for m in METHODS.values() if m is not method for k in m.own_keys}
    return [k for k in keys if k in method.space or (
        k not in others and (method.kind_keys is None or k in method.kind_keys))]


def check_method_choice(user: Mapping[str, Any], user_ranges: Mapping[str, Domain]) -> None:
    """A --set or --range on the key naming the method: each unit's method is the one --methods
    gives it (`method_layers`), which would silently replace the user's value."""
    if METHOD_KEY in user:
        value = shown(user[METHOD_KEY])
        raise ConfigError(f"--set {METHOD_KEY}={value}: the method is chosen with --methods "
                          f"(--methods {value})")
    if METHOD_KEY in user_ranges:
        domain = user_ranges[METHOD_KEY]
        names = (f" (--methods {shown(list(domain.options), joined=True)})"
                 if isinstance(domain, Choice) else "")
        raise ConfigError(f"--range {METHOD_KEY}: the method is chosen with --methods{names}")


def check_method_keys(methods: tuple[str, ...], user: Mapping[str, Any],
                      user_ranges: Mapping[str, Domain]) -> None:
    """A --set or --range on the method's key, or on one the chosen methods do not have, or a
    --set against a value a method fixes: one line naming the methods."""
    check_method_choice(user, user_ranges)
    chosen = [METHODS[name] for name in methods]
    for key, value in user.items():
        owners = [m.name for m in METHODS.values() if key in m.own_keys]
        if owners and not set(owners) & set(methods):
            raise ConfigError(f"--set {key}: only {', '.join(owners)} read it, and --methods "
                              f"runs {', '.join(methods)}")
        for method in chosen:
            if key in method.ignores:
                continue
            fixed = method.protocol.get(key, value)
            if fixed != value:
                raise ConfigError(f"--set {key}={shown(value)}: {method.name} fixes it at "
                                  f"{shown(fixed)} ({method.trains}); leave {method.name} out of "
                                  "--methods or this --set out")
    for key in user_ranges:
        if not any(kept_keys(method, [key]) for method in chosen):
            searchers = [m.name for m in METHODS.values() if kept_keys(m, [key])]
            raise ConfigError(f"--range {key}: none of {', '.join(methods)} searches it"
                              + (f" (searched by {', '.join(searchers)})" if searchers
                                 else ""))


def check_hooks(method: Method, config: Config, depths: tuple[int, int] | None) -> None:
    """A deep method's setting its towers cannot hold (more adapted blocks than a tower has):
    its one line before Ray starts, as the model's build would give it in every trial."""
    if method.hooked_blocks is not None and depths:
        values = flatten(config)
        for depth in depths:
            method.hooked_blocks(values, depth)


def check_prompt_room(method: Method, values: Mapping[str, Any], space: Mapping[str, Domain],
                      model: str, dataset: str) -> None:
    """Every context a method's trials can draw (a count of vectors, or an init phrase's own
    tokens) leaves <SOT>, a token of the class name and <EOT> within the model's text positions,
    by the rule the model's build applies (vacsr/model/prompt_room.py): one line before Ray
    starts, not a failure in each trial that draws it."""
    if not method.learned_context:
        return
    from vacsr.model import prompt_room
    from vacsr.model.configs import model_config

    config = model_config(model)
    positions = (config or {}).get("text_cfg", {}).get("context_length")
    if positions is None:  # a model only open_clip resolves: its build checks it
        return

    def drawn(key: str) -> tuple:
        return bounding_values(space[key]) if key in space else (values[key],)

    largest = max(int(v) for v in drawn(prompt_room.COUNT_KEY))
    for init in drawn(prompt_room.INIT_KEY):
        prompt_room.check_room(largest, init, model, positions,
                               runs=f"{dataset}'s {method.name} runs")


def ignored_settings(methods: tuple[str, ...], user: Mapping[str, Any]) -> list[str]:
    """A line per --set a chosen method leaves out (`Method.ignores`: zero-shot CLIP has one
    epoch, its evaluation, whatever --epochs gives the trained methods), so that no value the
    user gave is dropped without a word."""
    return [f"--set {key}={shown(value)} does not reach {name}, which keeps {key}="
            f"{shown(METHODS[name].protocol[key])}: it trains {METHODS[name].trains}"
            for name in methods for key, value in user.items()
            if key in METHODS[name].ignores and METHODS[name].protocol[key] != value]


def method_layers(method: Method) -> dict[str, Any]:
    """The config values a method's units take beside the sweep's: its name and what it fixes."""
    return {METHOD_KEY: method.name, **method.protocol}


def method_ranges(method: Method, ranges: Mapping[str, Domain]) -> dict[str, Domain]:
    """The sweep's ranges (the profile's and --range) a method's trials search."""
    return {key: ranges[key] for key in kept_keys(method, ranges)}


def method_space(method: Method, kind: SweepKind) -> dict[str, Domain]:
    """The kind's space as the method searches it, its own keys added, less the keys only other
    methods read (the sigmoid baseline has no KL weight to search)."""
    space = method.searched(kind.space)
    return {key: space[key] for key in kept_keys(method, space)}


def searches_batch_size(method: Method) -> bool:
    return bool(kept_keys(method, ["train.batch_size"]))


def unit_configs(kind: SweepKind, datasets: list[str], methods: tuple[str, ...],
                 layers: list[dict[str, Any]], user_keys: set[str], storage: Path,
                 ranges: dict[str, Domain], fixed: dict[str, str], depths
                 ) -> tuple[dict[str, Config], dict[str, dict[str, Domain]]]:
    """Each unit's (dataset x method) base config and searched space, checked: the sweep's
    layers, then the method's values; a method's fixed values are
    never searched. A dataset's units share its prefix cache: the frozen features of the
    methods whose towers are frozen are computed once per dataset."""
    configs, spaces = {}, {}
    for method_name in methods:
        method = METHODS[method_name]
        for d in datasets:
            unit = unit_name(d, method_name, methods)
            own = {"data.dataset": d,
                   "data.prefix_cache_dir": str(prefix_cache_folder(storage, d))}
            config = build_config([layers[0], own, *layers[1:], method_layers(method)],
                                  user_keys)
            sizes = kind.batch_sizes.get(d, ()) if searches_batch_size(method) else ()
            space = dataset_space(method_space(method, kind), sizes,
                                  method_ranges(method, ranges), config.train.workers, d,
                                  {**fixed, **dict.fromkeys(method.protocol, "")}, config)
            spaces[unit] = clamp_blocks(space, depths)
            check_blocks(config, depths, unit)  # a value the runs refuse fails before Ray
            check_hooks(method, config, depths)
            check_space_values(spaces[unit], config, unit)
            check_prompt_room(method, flatten(config), spaces[unit], config.model.name, d)
            configs[unit] = config
    return configs, spaces
