"""A Config built and checked: defaults <- YAML file <- `key.sub=value` overrides, or from a
saved dict. Unknown keys and invalid values raise one ConfigError naming the key before anything
runs."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from vacsr.config.overrides import apply_mapping, parse_override, set_value
from vacsr.config.schema import Config
from vacsr.config.validation import validate
from vacsr.config.yaml_reader import read_yaml_file

# (the config so far, the keys the YAML file and the overrides gave) -> None: fills in what
# depends on the values given (a method's fixed values, vacsr/methods/method.py) before validation
Fill = Callable[[Config, frozenset[str]], None]


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                base: Config | None = None, fill: Fill | None = None) -> Config:
    """Defaults <- YAML file <- `key.sub=value` overrides <- `fill`, then validate."""
    config = base if base is not None else Config()
    given: set[str] = set()
    if path is not None:
        path = Path(path)
        mapping = read_yaml_file(path, "a YAML file of config overrides") or {}
        apply_mapping(config, mapping, source=str(path))
        given.update(f"{section}.{name}" for section, values in mapping.items()
                     for name in (values or {}))
    for text in overrides:
        key, value = parse_override(text)
        set_value(config, key, value)
        given.add(key)
    if fill is not None:
        fill(config, frozenset(given))
    validate(config)
    return config


def from_dict(mapping: dict[str, Any]) -> Config:
    """Nested or flat (dotted) mapping -> validated Config."""
    config = Config()
    if all("." in k for k in mapping):
        for key, value in mapping.items():
            set_value(config, key, value)
    else:
        apply_mapping(config, mapping)
    validate(config)
    return config
