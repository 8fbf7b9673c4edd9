"""CPU-seconds of every process on this machine while a command runs, by what it is: a sweep's
Ray processes by the title Ray gives them (`ray::ImplicitFunc.train` a Tune trial actor,
`ray::EvalWorker...` an evaluation actor, `ray::run_dataset` a dataset's task), Ray's daemons, the
command itself. `/usr/bin/time` cannot say this: Ray's workers are children of Ray's raylet, which
no waiting parent reaps.

    .venv/bin/python benchmarks/bench_processes.py -- .venv/bin/python sweeps/base2novel.py \\
        --datasets eurosat --storage /tmp/one

It reads /proc every `--interval` seconds (a process that lives shorter is missed, one that ends
loses at most its last interval) and prints the `--top` processes, then a line per kind and the
total. Linux only.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
# (what a process is, a piece of its command line or Ray title), first match wins
KINDS = (("Tune trial actor", "ray::ImplicitFunc"), ("evaluation actor", "ray::EvalWorker"),
         ("dataset task", "ray::run_dataset"), ("Ray Train", "ray::TrainController"),
         ("Ray Train", "ray::RayTrainWorker"), ("Ray daemon", "ray/dashboard"),
         ("Ray daemon", "ray::DashboardAgent"), ("Ray daemon", "ray::RuntimeEnvAgent"),
         ("Ray daemon", "raylet"), ("Ray daemon", "gcs_server"), ("Ray daemon", "log_monitor"),
         ("Ray daemon", "autoscaler"), ("other Ray worker", "ray::"),
         ("other Ray worker", "default_worker.py"), ("MLflow server", "mlflow"))


def _read(pid: str) -> tuple[float, str] | None:
    """(CPU-s so far, command line) of a process; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, command or stat.split("(")[1].split(")")[0]


def _kind(titles: list[str], root: bool) -> str:
    if root:
        return "the command"
    for kind, piece in KINDS:
        if any(piece in title for title in titles):
            return kind
    return "other"


def sample(command: list[str], interval: float) -> tuple[dict, float, int]:
    """Run `command`; {pid: (CPU-s used meanwhile, titles seen, kind)}, its wall s, its code."""
    before = {pid: seen[0] for pid in os.listdir("/proc") if pid.isdigit()
              if (seen := _read(pid))}
    used: dict[str, float] = {}
    titles: dict[str, list[str]] = defaultdict(list)
    start = time.time()
    process = subprocess.Popen(command)
    while True:
        done = process.poll() is not None
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            seen = _read(pid)
            if seen is None:
                continue
            used[pid] = max(used.get(pid, 0.0), seen[0] - before.get(pid, 0.0))
            if seen[1] not in titles[pid] and not seen[1].startswith("ray::IDLE"):
                titles[pid].append(seen[1])
        if done:
            break
        time.sleep(interval)
    root = str(process.pid)
    return ({pid: (cpu, titles[pid], _kind(titles[pid], pid == root))
             for pid, cpu in used.items() if cpu > 0}, time.time() - start, process.returncode)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    found, wall, code = sample(command, args.interval)
    rows = sorted(found.items(), key=lambda item: -item[1][0])
    for pid, (cpu, titles, kind) in rows[:args.top]:
        shown = [t.split()[0] for t in titles if t.startswith("ray::")] or titles  # Ray's names
        print(f"{cpu:8.1f} CPU-s  {kind:18} {pid:>7}  {' | '.join(shown)[:110]}")
    by_kind: dict[str, list[float]] = defaultdict(list)
    for cpu, _, kind in found.values():
        by_kind[kind].append(cpu)
    print()
    for kind, cpus in sorted(by_kind.items(), key=lambda item: -sum(item[1])):
        print(f"{sum(cpus):8.1f} CPU-s  {kind} ({len(cpus)} processes)")
    print(f"SUMMARY {sum(map(sum, by_kind.values())):.1f} CPU-s on the machine, {wall:.1f} s "
          f"wall, exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
