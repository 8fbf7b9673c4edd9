"""A Config written out: as a nested or flat (dotted) dict, and as YAML with its password
redacted."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from vacsr.atomic import atomic_write_text
from vacsr.config.schema import Config
from vacsr.redact import redact_uri


def to_dict(config: Config) -> dict[str, dict[str, Any]]:
    return dataclasses.asdict(config)


def flat_dict(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"loss": {"beta": 1}} -> {"loss.beta": 1}: nested mappings (a config's sections, Tune's
    nesting of dotted keys) joined with dots; keys already dotted pass as they are."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_dict(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def flatten(config: Config) -> dict[str, Any]:
    """{"loss.beta": 1.0, ...}: one entry per config key (used for tracking params)."""
    return flat_dict(to_dict(config))


def public_dict(config: Config) -> dict[str, dict[str, Any]]:
    """`to_dict(config)` as it may be written or logged: a secret in tracking.uri or
    train.storage_path (an s3:// URI with keys) is `***` (the run gets it from the config in
    memory, MLflow from its environment variables)."""
    values = to_dict(config)
    for section, key in (("tracking", "uri"), ("train", "storage_path")):
        if values[section][key]:
            values[section][key] = redact_uri(values[section][key])
    return values


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config as YAML, atomically; `load_config` reads it back unchanged
    (a password in tracking.uri excepted: see public_dict)."""
    atomic_write_text(path, yaml.safe_dump(public_dict(config), sort_keys=False))
