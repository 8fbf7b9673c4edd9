"""Start-up of vacsr's entry points and of each kind of process a sweep starts: wall and
CPU-seconds (user + system) of a fresh interpreter, this tree against an older one.

    .venv/bin/python benchmarks/bench_imports.py [--before OLD_CHECKOUT] [--repeats 3]

Entry points: `vacsr --help`, `python sweeps/base2novel.py --help`, and a sweep refused on a
folder another driver holds (the refusal is one line; what it costs is the interpreter's start).
Process kinds: the module each kind of process imports before it works (the sweep driver and
each dataset task, a Tune trial actor, a Ray Train worker, an evaluation actor, `vacsr train`).
An older tree (`git archive <commit> | tar -x -C /tmp/old`) may keep these modules elsewhere: each
kind lists its module in every layout, and the first one that tree has is imported. The trees
take turns, repeat by repeat, so the machine's load falls on both alike; the table shows medians
and the after/before ratio of CPU-seconds. Both trees run with this interpreter's packages.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
# process kind -> the module its process imports first, newest layout first
KINDS = {
    # the sweep script parses, plans and locks with vacsr.sweep.cli alone (the entry points
    # above); the driver then imports the driver module; each dataset task runs a function of
    # that module, which imports the search and the final runs (an older tree: the one module)
    "sweep driver": ("vacsr.sweep.flow.driver", "vacsr.sweep.driver"),
    "dataset task": ("vacsr.sweep.flow.driver, vacsr.sweep.search.tune, vacsr.sweep.final.seeds",
                     "vacsr.sweep.driver"),
    "Tune trial actor": ("vacsr.sweep.search.trial", "vacsr.sweep.trial"),
    "Ray Train worker": ("vacsr.distributed.worker",),
    "evaluation actor": ("vacsr.distributed.eval_actor",),
    "vacsr train": ("vacsr.train.loop",),
}
HOLDER = """
import sys, time
try:
    from vacsr.sweep.plan.ownership import DriverLock
except ImportError:
    from vacsr.sweep.ownership import DriverLock
DriverLock(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def _timed(argv: list[str], tree: Path, expect: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """(wall s, user + system CPU-s) of one process run in `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "RAY_USAGE_STATS_ENABLED": "0"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in expect:
        sys.exit(f"bench_imports: {' '.join(argv)} in {tree} exited {done.returncode}, "
                 f"expected {expect}: {done.stderr.strip()[-400:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _module_in(tree: Path, names: tuple[str, ...]) -> str:
    """The first of `names` (each one module, or several separated by commas) that `tree` has."""
    for name in names:
        if all((tree / Path(*module.strip().split("."))).with_suffix(".py").is_file()
               for module in name.split(",")):
            return name
    raise SystemExit(f"bench_imports: {tree} has none of {names}")


def _locked_refusal(tree: Path) -> tuple[float, float]:
    """A sweep started on a folder whose driver lock another process holds."""
    with tempfile.TemporaryDirectory() as storage:
        folder = Path(storage) / "base2novel"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=tree, env=env,
                                  stdout=subprocess.PIPE, text=True)
        try:
            if holder.stdout.readline().strip() != "held":
                sys.exit(f"bench_imports: could not hold the driver lock of {folder}")
            return _timed([sys.executable, "sweeps/base2novel.py", "--storage", storage,
                           "--name", "base2novel"], tree, expect=(2,))
        finally:
            holder.kill()
            holder.wait()


def measurements(tree: Path) -> dict[str, tuple[float, float]]:
    py = sys.executable
    rows = {
        "vacsr --help": _timed([py, "-c", "import sys; from vacsr.cli import main; "
                                "sys.argv = ['vacsr', '--help']; sys.exit(main())"], tree),
        "sweeps/base2novel.py --help": _timed([py, "sweeps/base2novel.py", "--help"], tree),
        "sweep refused on a held folder": _locked_refusal(tree),
    }
    for kind, names in KINDS.items():
        rows[f"process: {kind}"] = _timed([py, "-c", f"import {_module_in(tree, names)}"], tree)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="an older vacsr tree to compare with")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trees = {"after": HERE}
    if args.before is not None:
        trees = {"before": args.before.resolve(), "after": HERE}
    runs: dict[str, list[dict]] = {label: [] for label in trees}
    for repeat in range(args.repeats):
        for label, tree in trees.items():  # taking turns
            runs[label].append(measurements(tree))
            print(f"repeat {repeat + 1}/{args.repeats}: {label} done", file=sys.stderr)
    names = list(runs["after"][0])
    med = {label: {n: (statistics.median(r[n][0] for r in rs),
                       statistics.median(r[n][1] for r in rs)) for n in names}
           for label, rs in runs.items()}
    head = f"{'start-up (median of ' + str(args.repeats) + ')':<36}"
    for label in trees:
        head += f"{label + ' wall s':>14}{label + ' CPU s':>14}"
    print(head + (f"{'CPU after/before':>18}" if "before" in trees else ""))
    for name in names:
        line = f"{name:<36}"
        for label in trees:
            line += f"{med[label][name][0]:>14.2f}{med[label][name][1]:>14.2f}"
        if "before" in trees:
            line += f"{med['after'][name][1] / med['before'][name][1]:>18.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
