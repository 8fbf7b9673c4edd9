"""How close `--plan`'s estimate comes to the sweep it plans: the plan, then the same sweep run
right after on the same machine, its trials' times read back from its MLflow runs.

    .venv/bin/python benchmarks/bench_plan_estimate.py                 # the embedded base2novel
    .venv/bin/python benchmarks/bench_plan_estimate.py --datasets dtd,eurosat
    .venv/bin/python benchmarks/bench_plan_estimate.py --recalibrate   # costs measured, not kept

Measured: the wall time from the sweep run's start (after its own calibration) to the last
trial's end (the trial phase, with the final seeds of datasets that finished meanwhile), and to
the last dataset's end. The estimate is the plan's wall time (totals.wall_s: the datasets'
searches and final seeds). The plan and the run read the costs this machine keeps
(docs/sweeps.md) unless `--recalibrate`: run it both ways to compare. A scratch sweep folder
under the system's temporary folder is deleted afterwards.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vacsr.records.artifacts import SWEEP_COST  # noqa: E402
from vacsr.records.sweep_records import SweepRecords  # noqa: E402
from vacsr.records.uri import resolve_tracking_uri  # noqa: E402

TOLERANCE = 0.35  # the acceptance: within +-35%


def sweep(argv: list[str]) -> float:
    """Run sweeps/base2novel.py with `argv`; its wall seconds (a failure ends the benchmark)."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, str(ROOT / "sweeps" / "base2novel.py"), *argv],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_plan_estimate: {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    print(done.stdout.strip())
    return time.perf_counter() - start


def measured_phases(folder: Path) -> tuple[float, float, dict]:
    """(trial phase s, trials and finals s, the run's own plan artifact) of the sweep in `folder`,
    from its MLflow runs: from the sweep run's start (after the calibration) to the last trial's
    end, and to the last dataset run's end."""
    records = SweepRecords(resolve_tracking_uri(None, default_dir=folder), "vacsr-base2novel")
    sweep_run = records.sweep_run(None)
    datasets = records.dataset_runs(sweep_run)
    trials = [run for dataset in datasets for run in records.child_runs(dataset.info.run_id)
              if "-final-seed" not in run.info.run_name]
    start = sweep_run.info.start_time
    trial_end = max(r.info.end_time for r in trials)
    end = max(r.info.end_time for r in datasets)
    own = records.artifact_json(sweep_run.info.run_id, SWEEP_COST)
    return (trial_end - start) / 1000, (end - start) / 1000, own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", help="subset (default: all 11)")
    parser.add_argument("--recalibrate", action="store_true",
                        help="the plan and the run measure their costs (default: kept ones)")
    args = parser.parse_args(argv)
    subset = ["--datasets", args.datasets] if args.datasets else []
    subset += ["--recalibrate"] if args.recalibrate else []
    with tempfile.TemporaryDirectory(prefix="vacsr-bench-plan-") as tmp:
        storage, out = Path(tmp) / "sweeps", Path(tmp) / "plan.json"
        plan_s = sweep(["--plan", "--plan-out", str(out), "--storage", str(storage), *subset])
        run_s = sweep(["--storage", str(storage), *subset])
        trial_s, with_finals_s, own = measured_phases(storage / "base2novel")
        plan = json.loads(out.read_text())
    estimated = plan["totals"]["wall_s"]
    print(f"--plan answered in {plan_s:.0f} s; the sweep ran {run_s:.0f} s")
    print(f"estimated wall of trials and final seeds {estimated:.0f} s (no stopping: "
          f"{plan['totals']['wall_no_stop_s']:.0f} s); the run's own plan "
          f"{own['totals']['wall_s']:.0f} s")
    print(f"measured: trial phase {trial_s:.0f} s, with the final seeds {with_finals_s:.0f} s")
    ratio = estimated / with_finals_s
    within = abs(ratio - 1) <= TOLERANCE
    print(f"SUMMARY estimate / measured {ratio:.2f} ({'within' if within else 'outside'} "
          f"+-{TOLERANCE:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
