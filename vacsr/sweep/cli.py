"""The entry of the sweep scripts (sweeps/*.py): `main(kind)` parses the flags into a checked
plan (sweep/plan/), runs it (sweep/flow/driver.py) and says where the results are.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from vacsr.errors import ConfigError, VacsrError
from vacsr.sweep.cost.memory import refuse_unfit
from vacsr.sweep.plan.command_line import plan_from_args
from vacsr.sweep.plan.flags import build_parser
from vacsr.sweep.plan.ownership import DriverLock
from vacsr.sweep.spec.kind import SweepKind

# the driver's dependencies, found without importing them (importing costs seconds: --help, a
# bad flag and a locked folder answer at once): an interpreter without them fails in the sweep
# script's import guard, in one line
DRIVER_MODULES = ("ray", "optuna", "mlflow")
_missing = [name for name in DRIVER_MODULES if importlib.util.find_spec(name) is None]
if _missing:
    raise ImportError(f"No module named {_missing[0]!r} (the cluster extras: "
                      "pip install 'vacsr[cluster]')")


def plan_out_target(value: str | None) -> Path | None:
    """--plan-out's file, checked before anything runs: in an existing folder this process can
    write to, and a regular file or none yet (never a folder or a device such as /dev/null)."""
    from vacsr.atomic import require_regular_target, require_writable_folder

    if not value:
        return None
    out = Path(value).expanduser().resolve()
    if not out.parent.is_dir():
        raise ConfigError(f"--plan-out {value}: no folder {out.parent}; expected a file path in "
                          "an existing folder")
    try:
        require_regular_target(out)
        require_writable_folder(out.parent, "--plan-out")
    except VacsrError as exc:
        raise ConfigError(f"--plan-out {exc}") from None  # the line names the path
    return out


def print_plan(kind: SweepKind, args) -> int:
    """--plan: the cost estimate on stdout (and as JSON at --plan-out); 0, 2 on bad input or when
    --plan-out cannot be written, 128 + the signal's number when stopped (one line, nothing left
    behind)."""
    from vacsr.atomic import atomic_write_text
    from vacsr.stop import SignalNote, Stopped
    from vacsr.sweep.cost.measure import measure_sweep_cost
    from vacsr.sweep.cost.sweep_cost import format_sweep_cost

    note = SignalNote()  # noted, and raised while the calibration waits on Ray
    try:
        out = plan_out_target(args.plan_out)
        plan = plan_from_args(kind, args, check_memory=refuse_unfit)
        cost = measure_sweep_cost(plan, note.check)
    except VacsrError as exc:
        print(f"vacsr: error: {exc}", file=sys.stderr)
        return 2
    except Stopped as exc:
        print(f"vacsr: {exc}; --plan wrote nothing", file=sys.stderr)
        return exc.exit_code
    finally:
        note.restore()
    print(format_sweep_cost(cost))
    if out is not None:
        try:  # checked above, and still able to fail (the disk filled meanwhile)
            atomic_write_text(out, json.dumps(cost, indent=2) + "\n")
        except (VacsrError, OSError) as exc:
            why = f"{out}: cannot write ({exc.strerror})" if isinstance(exc, OSError) else exc
            print(f"vacsr: error: --plan-out {why}", file=sys.stderr)
            return 2
        print(f"plan written to {out}")
    return 0


def main(kind: SweepKind, argv: list[str] | None = None) -> int:
    """Run the sweep; 0 when every dataset finished, 1 when some failed, 2 on bad input."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    args = build_parser(kind).parse_args(argv)
    if args.plan:
        return print_plan(kind, args)
    start = time.time()
    locks: list[DriverLock] = []
    try:  # one driver per sweep folder from before its data is written (plan/ownership.py)
        plan = plan_from_args(kind, args, check_memory=refuse_unfit,
                              on_folder=lambda folder: locks.append(DriverLock(folder)))
        from vacsr.sweep.flow.driver import comparison_hint, mlflow_ui_hint, run_sweep

        outcome = run_sweep(plan)
    except VacsrError as exc:
        if hasattr(exc, "exit_code"):  # SIGTERM / SIGINT: the driver stopped cleanly
            print(f"vacsr: {exc}", file=sys.stderr)
            return exc.exit_code
        print(f"vacsr: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the MLflow server went away while the driver itself logged
        from vacsr.sweep.flow.driver import SweepTrackingDown
        from vacsr.sweep.search.recovery import tracking_failure

        down = tracking_failure(exc)
        if not down:
            raise
        print(f"vacsr: error: {SweepTrackingDown(args.tracking_uri or '', down)}",
              file=sys.stderr)
        return 2
    finally:
        for lock in locks:
            lock.release()
    print(f"sweep {plan.name} done in {time.time() - start:.0f} s; results in {plan.storage}")
    from vacsr.records.sweep_records import SweepRecords

    experiment_id = SweepRecords(plan.tracking_uri, plan.kind.experiment).experiment_id()
    print(f"open the MLflow UI: {mlflow_ui_hint(plan.tracking_uri, experiment_id, plan.name)}")
    compared = comparison_hint(plan.tracking_uri, experiment_id, plan.name)
    if compared:  # a sweep of several methods
        print(f"the method comparison: {compared}")
    if outcome.failed:
        print(f"vacsr: {len(outcome.failed)} dataset(s) failed: " + "; ".join(
            f"{d}: {why}" for d, why in outcome.failed.items()), file=sys.stderr)
        return 1
    return 0
