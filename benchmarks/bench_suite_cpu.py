"""The test suite's CPU-seconds by test: every process `make test` starts, Ray's workers included,
charged to the test that was running on the pytest worker it descends from when it started.
`/usr/bin/time` counts make's tree only, and `--durations` gives wall time, which on a
machine both Ray lanes keep busy says little about what a test costs.

Process accounting (Debian's `acct`, as root) records every process at its exit; this module
is also the pytest plugin that records each test's window:

    touch /tmp/pacct && accton /tmp/pacct
    PYTHONPATH=benchmarks make test PYTEST_ARGS="-p bench_suite_cpu"
    accton off
    .venv/bin/python benchmarks/bench_suite_cpu.py /tmp/pacct

A process is charged by its ancestry (its parent when it exited, as accounting records it) up to
a pytest worker, then by its start time (whole seconds) to the test running there; the workers'
own CPU (the tests that run in them, the in-process sweep drivers) is a line of its own, and
what no worker's ancestry reaches (a process whose parent had exited first) another. Linux only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

WINDOWS = Path(os.environ.get("VACSR_SUITE_WINDOWS", "/tmp/vacsr-suite-windows.jsonl"))
HZ = 100.0  # dump-acct's ticks per second


# ------------------------------------------------------------------ the pytest plugin
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Record the test's window (set-up to teardown) and the worker's pid; pytest runs it."""
    start = time.time()
    yield
    with open(WINDOWS, "a") as out:
        out.write(json.dumps([item.nodeid, os.getpid(), start, time.time()]) + "\n")


# ------------------------------------------------------------------ the report
def read_accounting(path: Path) -> list[dict]:
    """dump-acct's records: command, CPU-s (user + system), pid, parent pid, start (epoch s)."""
    lines = subprocess.run(["dump-acct", str(path)], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    records = []
    for line in lines:
        fields = [f.strip() for f in line.split("|")]
        started = time.mktime(time.strptime(fields[-1], "%a %b %d %H:%M:%S %Y"))
        records.append({"command": fields[0], "cpu": (float(fields[2]) + float(fields[3])) / HZ,
                        "pid": int(fields[9]), "ppid": int(fields[10]), "start": started})
    return records


def charged(records: list[dict], windows: list[list]) -> Counter:
    """Test id (or a line for the workers' own and the unreached) -> CPU-s."""
    by_pid: dict[int, list[dict]] = {}
    for record in records:
        by_pid.setdefault(record["pid"], []).append(record)
    workers = {pid for _, pid, _, _ in windows}
    totals: Counter = Counter()
    for record in records:
        node, hops = record, 0
        while node["pid"] not in workers and hops < 64:
            parents = [p for p in by_pid.get(node["ppid"], []) if p["start"] <= node["start"] + 1]
            if not parents:
                node = None
                break
            node, hops = parents[-1], hops + 1
        if node is None or node["pid"] not in workers:
            totals["(no pytest worker in its ancestry)"] += record["cpu"]
        elif record["pid"] in workers:
            totals["(the pytest workers themselves)"] += record["cpu"]
        else:
            running = [w for w in windows if w[1] == node["pid"]
                       and w[2] - 1 <= record["start"] <= w[3] + 1]
            totals[running[-1][0] if running else "(between tests)"] += record["cpu"]
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pacct", type=Path, help="the accounting file accton wrote")
    parser.add_argument("--windows", type=Path, default=WINDOWS)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    windows = [json.loads(line) for line in args.windows.read_text().splitlines()]
    records = read_accounting(args.pacct)
    totals = charged(records, windows)
    wall = {nodeid: end - start for nodeid, _, start, end in windows}
    print(f"{sum(r['cpu'] for r in records):8.1f} CPU-s in {len(records)} processes")
    for name, seconds in totals.most_common(args.top):
        shown = f"{wall[name]:6.1f} s wall" if name in wall else " " * 11
        print(f"{seconds:8.1f} CPU-s  {shown}  {name}")


if __name__ == "__main__":
    main()
