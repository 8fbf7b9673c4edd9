"""Every import a vacsr module makes, read from its source with ast: at the top, inside functions
and classes, in TYPE_CHECKING blocks. Shared by the architecture tests (the layer order, the core
that imports no cluster packages)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vacsr"


def module_name(path: Path) -> str:
    """vacsr/sweep/plan/folders.py -> vacsr.sweep.plan.folders (a package: its __init__'s name)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def vacsr_modules() -> dict[str, Path]:
    """module name -> its file, for every module of the package."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_in(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import anywhere in `source` (functions, classes and
    TYPE_CHECKING blocks too); `from a import b` yields a and a.b, relative imports resolved."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[:None if is_package else -1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found
