"""The library core imports no ray, mlflow or optuna."""
import pkgutil
import subprocess
import sys

import vacsr

FORBIDDEN = ("ray", "mlflow", "optuna")
OUTSIDE_CORE = ("vacsr.distributed", "vacsr.records", "vacsr.sweep")


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
