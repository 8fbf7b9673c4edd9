"""What a killed driver's local Ray instance leaves behind, ended by the next local start.

`ray.init()` without an address starts a Ray instance whose processes (GCS, raylet, dashboard,
the DashboardAgent and RuntimeEnvAgent, idle workers) are the driver's descendants. When the driver
is killed with SIGKILL (the OOM killer, `kill -9`, a scheduler's hard stop) nothing shuts them
down: they stay, holding memory and ports, and the agents ignore SIGTERM for seconds.

Other Ray instances may run on the same machine (other users' jobs, a `ray start` cluster), so
nothing is ever chosen by name. Each instance vacsr starts is recorded in
`<cache>/ray-instances/<session>.json` (cache: `$VACSR_CACHE_DIR`, else `~/.cache/vacsr`) with the
driver's pid and start time, the session folder, and the pid and start time of every process of
the instance, and the instance's own temporary folder (`new_temp_dir`). The next local start reads
the records: a record whose driver is provably dead (no such pid, or a pid reused by a process that
started later) has its processes killed, those still running with the recorded start time only,
its temporary folder removed, and is removed. A clean exit removes its own record. Linux only
(process start times come from /proc); elsewhere nothing is recorded.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from vacsr.atomic import atomic_write_json

PROC = Path("/proc")
TERM_GRACE_S = 2.0  # the agents ignore SIGTERM for longer: SIGKILL after this
TEMP_PREFIX = "vacsr-ray-"  # an instance's temporary folder; a record names no other to remove


def records_dir() -> Path:
    base = os.environ.get("VACSR_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "vacsr") / "ray-instances"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); None when
    there is no such process, or it has ended and waits to be reaped (a zombie)."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])  # fields after "(comm)": 3, 4, ...


def descendants(root: int) -> list[int]:
    """Pids of every living descendant of `root`."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def _alive_as_recorded(pid: int, started: int) -> bool:
    return start_time(pid) == started


def new_temp_dir() -> Path:
    """A new folder in the system's temporary folder for the temporary files of a local
    instance's processes (their TMPDIR): what they leave there on being ended goes with it."""
    return Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))


def record_instance(session_dir: str, temp_dir: Path | None = None) -> Path | None:
    """Record the local instance this process just started (call right after `ray.init`), and
    its temporary folder."""
    if not PROC.is_dir():
        return None
    me = os.getpid()
    if start_time(me) is None:
        return None
    processes = [[pid, start_time(pid)] for pid in descendants(me)]
    record = {"driver": [me, start_time(me)], "session_dir": session_dir,
              "processes": [p for p in processes if p[1] is not None],
              "temp_dir": str(temp_dir) if temp_dir else None}
    path = records_dir() / f"{Path(session_dir).name}.json"
    try:
        atomic_write_json(path, record)
    except Exception:  # noqa: BLE001  a record is a convenience: never stop a run for it
        return None
    atexit.register(path.unlink, missing_ok=True)  # a clean exit leaves nothing to reap
    return path


def reap_dead_instances() -> list[int]:
    """End the processes of every recorded instance whose driver is dead; returns their pids."""
    folder = records_dir()
    if not PROC.is_dir() or not folder.is_dir():
        return []
    ended: list[int] = []
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            driver, started = record["driver"]
            processes = [(int(pid), int(when)) for pid, when in record["processes"]]
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)  # unreadable: nothing in it can be trusted
            continue
        if _alive_as_recorded(driver, started):
            continue  # a running driver's instance, of this user or not: never touched
        ended.extend(_end(processes))
        remove_temp_dir(record.get("temp_dir"))
        path.unlink(missing_ok=True)
    return ended


def remove_temp_dir(folder: object) -> None:
    """Remove an ended instance's temporary folder (one `new_temp_dir` made: by its name)."""
    if isinstance(folder, (str, Path)) and Path(folder).name.startswith(TEMP_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


def _end(processes: list[tuple[int, int]]) -> list[int]:
    """SIGTERM, a short grace, then SIGKILL, each only to a process that is still the recorded
    one (same pid and start time: a reused pid belongs to someone else)."""
    living = [(pid, when) for pid, when in processes if _alive_as_recorded(pid, when)]
    for pid, _ in living:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < deadline and any(_alive_as_recorded(*p) for p in living):
        time.sleep(0.1)
    for pid, when in living:
        if _alive_as_recorded(pid, when):
            _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + TERM_GRACE_S  # SIGKILL is delivered asynchronously
    while time.monotonic() < deadline and any(_alive_as_recorded(*p) for p in living):
        time.sleep(0.05)
    return [pid for pid, _ in living]


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:  # gone already, or not ours to signal
        pass
