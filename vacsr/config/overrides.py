"""Overrides of a Config: `key.sub=value` texts and {section: {field: value}} mappings, each value
converted to its field's type, and how values are quoted in error lines and written back."""
from __future__ import annotations

import functools
import typing
from types import MappingProxyType
from typing import Any, Mapping

import yaml

from vacsr.config.schema import SECTIONS, Config
from vacsr.config.yaml_reader import load_yaml_text, yaml_problem
from vacsr.errors import ConfigError

MAX_SHOWN_CHARS = 120  # of a value quoted in an error line


def quoted(value: Any) -> str:
    """repr(value), cut to fit an error line: a bad value as it was given."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 3] + "..."


def shown(value: Any, *, joined: bool = False) -> str:
    """A good value as the user writes it: after `key=` in an override (true, false, null,
    else str()), or with `joined` after a flag that takes a comma-separated list
    (--seeds 1,2,3)."""
    if joined and isinstance(value, list):
        return ",".join(shown(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Convert a YAML value to the annotated type, or raise ConfigError naming `key`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {quoted(value)}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {quoted(value)}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {quoted(value)}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {quoted(value)}")
    if annotation is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {quoted(value)}")
    raise ConfigError(f"{key}: unsupported type {annotation!r}")


@functools.cache  # the schema is fixed; resolving its hints evaluates every annotation string
def section_types(section: str) -> Mapping[str, Any]:
    """{field: annotation} of one config section, resolved once (a sweep's plan sets and checks
    thousands of values); read-only, as every call shares it."""
    cls = typing.get_type_hints(Config)[section]
    return MappingProxyType(typing.get_type_hints(cls))


def set_value(config: Config, dotted_key: str, value: Any) -> None:
    """Set `section.field` on `config`, converting and checking the value's type."""
    parts = dotted_key.split(".")
    if len(parts) != 2:
        raise ConfigError(f"{dotted_key}: expected a key of the form section.field "
                          f"(sections: {', '.join(SECTIONS)})")
    section, name = parts
    if section not in SECTIONS:
        raise ConfigError(f"{dotted_key}: unknown section {section!r} "
                          f"(known: {', '.join(SECTIONS)})")
    types = section_types(section)
    if name not in types:
        raise ConfigError(f"{dotted_key}: unknown key {name!r} in section {section!r} "
                          f"(known: {', '.join(types)})")
    setattr(getattr(config, section), name, _coerce(value, types[name], dotted_key))


def apply_mapping(config: Config, mapping: dict[str, Any], source: str = "config") -> Config:
    """Apply a nested {section: {field: value}} mapping (as read from YAML)."""
    if not isinstance(mapping, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(mapping).__name__}")
    for section, values in mapping.items():
        if section not in SECTIONS:
            raise ConfigError(f"{source}: unknown section {section!r} "
                              f"(known: {', '.join(SECTIONS)})")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping")
        for name, value in values.items():
            set_value(config, f"{section}.{name}", value)
    return config


def parse_override(text: str) -> tuple[str, Any]:
    """`loss.beta=2.0` -> ("loss.beta", 2.0); the value is parsed as YAML (bounded loader)."""
    if "=" not in text:
        raise ConfigError(f"override {quoted(text)}: expected key.sub=value")
    key, raw = text.split("=", 1)
    try:
        value = load_yaml_text(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {quoted(text)}: value {yaml_problem(exc)}") from None
    return key.strip(), value
