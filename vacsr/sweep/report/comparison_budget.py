"""The comparison's budget section: every method's budget in one table, and whether the trained
methods' budgets agree (what a method trains and searches describes it: shown, never compared)."""
from __future__ import annotations

from typing import Any

from vacsr.sweep.report.table import readable

# budget entries that describe a method rather than what it was given: shown, never compared
DESCRIBED = ("trains", "searched")


def escaped(text: Any) -> str:
    """A cell's text: a `|` in a reason or a budget value would end the cell."""
    return str(text).replace("|", "\\|")


def budget_markdown(budget: dict[str, dict], single: frozenset[str]) -> str:
    """Every method's budget in one table, and whether the trained methods' budgets agree."""
    if not budget:
        return "## Budget\n\nNo budget was recorded.\n"
    keys = list(dict.fromkeys(k for given in budget.values() for k in given))
    lines = ["## Budget", "", "| method | " + " | ".join(keys) + " |",
             "|---|" + "---|" * len(keys)]
    for method, given in budget.items():
        lines.append(f"| {method} | " + " | ".join(escaped(_budget_value(given.get(k)))
                                                 for k in keys) + " |")
    trained = [given for method, given in budget.items() if method not in single]
    differing = [k for k in keys if k not in DESCRIBED
                 and len({_budget_value(g.get(k)) for g in trained}) > 1]
    if differing:
        lines += ["", f"The trained methods' budgets differ in: {', '.join(differing)}."]
    elif len(trained) > 1:
        lines += ["", "Every trained method had the same budget."]
    return "\n".join(lines) + "\n"


def _budget_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(readable(v) for v in value)
    return readable(value)
