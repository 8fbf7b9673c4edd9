"""The library core imports no ray, mlflow or optuna, and the training package none of the layers
that drive it (records, sweep, distributed): checked by importing the core, and in the source of
every module, where an import inside a function counts as much as one at the top."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import vacsr
from tests.architecture.source_imports import PACKAGE, imports_in, module_name

FORBIDDEN = ("ray", "mlflow", "optuna")
OUTSIDE_CORE = ("vacsr.distributed", "vacsr.records", "vacsr.sweep")
# package -> the vacsr packages none of its modules may import (the trainer is handed its logger)
NOT_IMPORTED = {"vacsr.train": ("vacsr.records", "vacsr.sweep", "vacsr.distributed")}


def test_core_modules_import_no_cluster_packages():
    modules = [m.name for m in pkgutil.walk_packages(vacsr.__path__, "vacsr.")
               if not m.name.startswith(OUTSIDE_CORE)]
    assert "vacsr.model.adapter" in modules and "vacsr.train.loop" in modules
    code = ("import importlib, sys\n"
            f"for name in {modules!r}: importlib.import_module(name)\n"
            f"print(','.join(sorted(m for m in {FORBIDDEN!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"core imported: {out.stdout.strip()}"


def _within(name: str, packages: tuple[str, ...] | list[str]) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def forbidden_imports() -> tuple[list[str], int]:
    """Each import a module makes that its layer must not, as 'file:line: module imports X',
    and how many modules were read."""
    found, paths = [], sorted(PACKAGE.rglob("*.py"))
    for path in paths:
        name = module_name(path)
        banned = [] if _within(name, OUTSIDE_CORE) else list(FORBIDDEN)
        for package, packages in NOT_IMPORTED.items():
            banned += packages if _within(name, (package,)) else ()
        for line, target in imports_in(path.read_text(), name, path.name == "__init__.py"):
            if _within(target, banned):
                where = path.relative_to(PACKAGE.parent)
                found.append(f"{where}:{line}: {name} imports {target}")
    return sorted(set(found)), len(paths)


def test_the_scan_sees_imports_inside_functions():
    source = ("import os\n"
              "def f():\n"
              "    from vacsr.records import TrackingCallback\n"
              "    import ray.train\n"
              "    from . import sibling\n")
    assert imports_in(source, "vacsr.train.loop") == [
        (1, "os"), (3, "vacsr.records"), (3, "vacsr.records.TrackingCallback"),
        (4, "ray.train"), (5, "vacsr.train"), (5, "vacsr.train.sibling")]
    assert _within("ray.train", FORBIDDEN) and not _within("raylib", FORBIDDEN)


def test_no_module_imports_what_its_layer_must_not_even_inside_a_function():
    found, read = forbidden_imports()
    assert read > 50 and (PACKAGE / "train" / "loop.py").is_file()
    assert found == [], "\n".join(found)
