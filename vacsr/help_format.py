"""What vacsr's command lines (`vacsr` and the sweep scripts) share: the help layout (each
option's default shown where it has one), a bad flag's one line, the non-empty value type."""
from __future__ import annotations

import argparse


def nonempty(text: str) -> str:
    """argparse type: a value that must not be empty (empty would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "expected a value, got an empty string (give a non-empty one)")
    return text


def flag_error(prog: str, message: str) -> str:
    """What argparse refused, naming the help to read (after `vacsr: error: `, on one line)."""
    return f"{message} (see {prog} --help)"


class DefaultsHelp(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help unless the help already says its default or
    the option has none (argparse's ArgumentDefaultsHelpFormatter would also print
    "(default: None)" for every flag that is unset by default)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default == argparse.SUPPRESS \
            or default == []
        if "default" in text or unset or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"
