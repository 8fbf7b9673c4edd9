"""A Config built and checked: defaults <- YAML file <- `key.sub=value` overrides, or from a
saved dict. Unknown keys and invalid values raise one ConfigError naming the key before anything
runs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from vacsr.config.overrides import apply_mapping, parse_override, set_value
from vacsr.config.schema import Config
from vacsr.config.validation import validate
from vacsr.config.yaml_reader import read_yaml_file


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                base: Config | None = None) -> Config:
    """Defaults <- YAML file <- `key.sub=value` overrides, then validate."""
    config = base if base is not None else Config()
    if path is not None:
        path = Path(path)
        apply_mapping(config, read_yaml_file(path, "a YAML file of config overrides") or {},
                      source=str(path))
    for text in overrides:
        set_value(config, *parse_override(text))
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
