"""Measured step costs kept, so that a step is measured once per what its costs depend on (the key
of cost_key.py), in two places:

    <sweep folder>/costs.json                  the run's own (folders.costs_file): `--resume`
                                               reads it
    $VACSR_CACHE_DIR/costs/<key digest>.json   this machine's (default ~/.cache/vacsr, beside
                                               the pretrained cache): `--plan` and the next
                                               sweep on the same machine or cluster read it

An entry holds its schema, the whole key, the costs, when they were measured and a SHA-256 of
all of that; it is written atomically (rename: concurrent writers replace each other with whole
files, the last one wins) and verified on every read. An entry that is not JSON, fails its
checksum, has another schema or another key (another step, device, torch...) is not used: one
note on stderr, then the next place, or a new measurement. `--recalibrate` reads neither.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from vacsr.atomic import atomic_write_json
from vacsr.errors import StorageError
from vacsr.sweep.cost.calibrate import StepCosts
from vacsr.sweep.cost.cost_key import changed_parts, key_digest

SCHEMA = 1  # an entry's layout; another one is measured again
MEASURED, SWEEP_FOLDER, MACHINE_CACHE = "measured now", "sweep folder", "machine cache"


@dataclass(frozen=True)
class CostSource:
    """Where a plan's step costs came from, for its records and its console line."""

    source: str  # MEASURED, SWEEP_FOLDER or MACHINE_CACHE
    path: str | None  # the entry read, or the machine cache's entry written
    measured_at: str  # UTC, ISO 8601
    seconds: float  # spent obtaining them

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def machine_cache_dir() -> Path:
    base = os.environ.get("VACSR_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "vacsr") / "costs"


def machine_entry(key: dict[str, Any]) -> Path:
    return machine_cache_dir() / f"{key_digest(key)[:32]}.json"


def _checksum(entry: dict[str, Any]) -> str:
    body = {part: entry.get(part) for part in ("schema", "key", "costs", "measured_at")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _step_costs(values: Any) -> StepCosts:
    """StepCosts from an entry's costs, each field present and of its type (ValueError)."""
    names = {f.name for f in fields(StepCosts)}
    if not isinstance(values, dict) or set(values) != names:
        raise ValueError("its costs are not StepCosts' fields")
    for name, value in values.items():
        if name == "device":
            ok = isinstance(value, str)
        else:
            ok = (value is None and name == "memory_gib") or (
                isinstance(value, (int, float)) and math.isfinite(value) and value >= 0)
        if not ok:
            raise ValueError(f"its cost {name} is {value!r}")
    return StepCosts(**values)


def read_entry(path: Path, key: dict[str, Any]) -> tuple[StepCosts | None, str, str | None]:
    """(costs, when measured, None) of a sound entry for `key`; (None, "", why not) otherwise,
    why being None where there is no entry."""
    if not path.is_file():
        return None, "", None
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(entry, dict):
            raise ValueError("not an object")
    except (OSError, ValueError):
        return None, "", "damaged (not a JSON entry)"
    if entry.get("schema") != SCHEMA:
        return None, "", f"stale (schema {entry.get('schema')!r}; this vacsr reads {SCHEMA})"
    if entry.get("sha256") != _checksum(entry):
        return None, "", "damaged (its SHA-256 does not match its content)"
    if entry.get("key") != key:
        kept = entry.get("key") if isinstance(entry.get("key"), dict) else {}
        return None, "", f"measured for another step ({', '.join(changed_parts(kept, key))})"
    try:
        return _step_costs(entry.get("costs")), str(entry.get("measured_at")), None
    except (TypeError, ValueError) as exc:
        return None, "", f"damaged ({exc})"


def write_entry(path: Path, key: dict[str, Any], costs: StepCosts, measured_at: str) -> Path:
    entry = {"schema": SCHEMA, "key": key, "costs": costs.as_dict(), "measured_at": measured_at}
    return atomic_write_json(path, {**entry, "sha256": _checksum(entry)})


def _note(text: str) -> None:
    print(f"vacsr: {text}", file=sys.stderr, flush=True)


def obtain_costs(key: dict[str, Any], measure: Callable[[], StepCosts], *,
                 folder_entry: Path | None, keep_in_folder: bool, recalibrate: bool
                 ) -> tuple[StepCosts, CostSource]:
    """The costs of `key`: the sweep folder's entry (`folder_entry`), else the machine's, else
    `measure()`d and kept in the machine cache (and with `keep_in_folder` in the sweep
    folder). `recalibrate`: measured whatever is kept."""
    start = time.perf_counter()
    machine = machine_entry(key)
    places = [] if recalibrate else [(SWEEP_FOLDER, folder_entry), (MACHINE_CACHE, machine)]
    for source, path in places:
        if path is None:
            continue
        costs, measured_at, why = read_entry(path, key)
        if why is not None:
            _note(f"{path}: costs {why}; not used")
        if costs is not None:
            if keep_in_folder and source != SWEEP_FOLDER and folder_entry is not None:
                write_entry(folder_entry, key, costs, measured_at)
            return costs, CostSource(source, str(path), measured_at,
                                     time.perf_counter() - start)
    costs = measure()
    measured_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        write_entry(machine, key, costs, measured_at)
    except (OSError, StorageError) as exc:  # a read-only home: the sweep goes on, measured
        _note(f"{machine}: costs not kept for the next sweep on this machine ({exc})")
    if keep_in_folder and folder_entry is not None:
        write_entry(folder_entry, key, costs, measured_at)
    return costs, CostSource(MEASURED, str(machine), measured_at, time.perf_counter() - start)


def source_line(costs: StepCosts, source: CostSource) -> str:
    """The console's line on where a plan's costs came from."""
    if source.source == MEASURED:
        return (f"costs: measured now on {costs.device} in {source.seconds:.1f} s, kept for the "
                f"next sweep here ({source.path})")
    return (f"costs: reused from the {source.source} ({source.path}; measured "
            f"{source.measured_at} on {costs.device}) in {source.seconds:.2f} s; "
            "--recalibrate measures them again")
