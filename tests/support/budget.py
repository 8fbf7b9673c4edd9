"""The suite's budget at the end of `make test`: each xdist worker's and each Ray lane's time and
their slowest tests, so a test that grows, or a lane that outgrows the other, shows in every run
(no timing is asserted; the machines are shared and noisy)."""
from __future__ import annotations

from collections import defaultdict

SLOWEST = 4  # tests shown per lane or worker


def _lane(report, lanes) -> str:
    """The Ray lane (`<id>@ray-a`) a test ran in, else the worker that ran it (gw0, gw1)."""
    group = report.nodeid.rsplit("@", 1)[-1] if "@" in report.nodeid else None
    if group in lanes:
        return group
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", None)
    return f"{worker or 'this process'}, outside the lanes"


def lane_times(reports, lanes) -> dict[str, dict[str, float]]:
    """lane -> test id -> its setup, call and teardown seconds together."""
    times: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for report in reports:
        if getattr(report, "duration", None) is not None and hasattr(report, "when"):
            times[_lane(report, lanes)][report.nodeid] += report.duration
    return times


def write_budget(terminal, lanes) -> None:
    reports = [r for found in terminal.stats.values() for r in found if hasattr(r, "nodeid")]
    times = lane_times(reports, lanes)
    if not times:
        return
    terminal.write_sep("=", "the suite's budget: time per lane and its slowest tests")
    for lane, tests in sorted(times.items(), key=lambda item: -sum(item[1].values())):
        terminal.write_line(f"{lane}: {sum(tests.values()):.0f} s in {len(tests)} tests")
        for nodeid, seconds in sorted(tests.items(), key=lambda item: -item[1])[:SLOWEST]:
            terminal.write_line(f"  {seconds:7.1f} s  {nodeid.rsplit('@', 1)[0]}")
