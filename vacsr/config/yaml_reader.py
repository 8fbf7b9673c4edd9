"""The bounded YAML reader of config text: no aliases, bounded nesting, bounded file size, and one
ConfigError line for a config file that cannot be read."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vacsr.errors import ConfigError

# Config text is parsed by a bounded YAML loader: no aliases, at most this deep, at most this long
MAX_YAML_DEPTH = 16  # a config file nests section -> key -> list
MAX_CONFIG_BYTES = 1 << 20


class YamlRefused(yaml.YAMLError):
    """Config text that the bounded loader does not read (an alias, too deep a nesting)."""

    def __init__(self, what: str, mark, advice: str) -> None:
        super().__init__(f"{what} (line {mark.line + 1}, column {mark.column + 1}): {advice}")


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader without aliases and with bounded nesting. An alias (`*name`) repeats a value
    without copying it: a few hundred bytes of nested aliases ("billion laughs") become billions
    of entries once the value is checked or printed. Deep nesting overflows the recursive
    composer. Config values need neither."""

    depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise YamlRefused(f"a YAML alias *{event.anchor}", event.start_mark,
                              "config text takes no anchors or aliases, write each value out")
        if self.depth >= MAX_YAML_DEPTH:
            raise YamlRefused(f"YAML nested deeper than {MAX_YAML_DEPTH} levels",
                              self.peek_event().start_mark,
                              "config values nest a few levels at most")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_yaml_text(text: str) -> Any:
    """`text` parsed as YAML by the bounded loader; YamlRefused or another YAMLError otherwise."""
    loader = _ConfigLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong with YAML text that did not load, to follow its name in an error line."""
    if isinstance(exc, YamlRefused):
        return f"holds {exc}"
    return f"is not valid YAML ({exc.__class__.__name__})"


def read_config_text(path: Path, expected: str) -> str:
    """The text of a config file the user names, or one ConfigError line: missing, unreadable,
    larger than MAX_CONFIG_BYTES, or not UTF-8 (a UTF-8 byte-order mark is accepted)."""
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found; expected {expected}")
    try:
        with open(path, "rb") as src:
            data = src.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB; expected "
                              f"{expected}")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start}); expected {expected}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: unreadable ({exc.strerror or exc.__class__.__name__}); "
                          f"expected {expected}") from None


def read_yaml_file(path: Path, expected: str) -> Any:
    """A config file parsed as YAML (`read_config_text`), or one ConfigError line."""
    text = read_config_text(path, expected)
    try:
        return load_yaml_text(text)
    except yaml.YAMLError as exc:
        problem = yaml_problem(exc).replace("is not valid YAML", "not valid YAML")
        raise ConfigError(f"{path}: {problem}; expected {expected}") from None
