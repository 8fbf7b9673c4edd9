"""A sweep folder belongs to one sweep.

- While a driver runs it holds an OS lock on `<sweep folder>/driver.lock` (flock: the kernel drops
  it when the driver dies, SIGKILL included); a second driver on the folder stops with one line
  naming the holder's pid and host.
- A folder that already holds a sweep (its sweep_state.json, or Optuna studies of its name) takes
  only `--resume`: a new sweep there would reuse the earlier one's MLflow runs and mix both in one
  Optuna study. Start a new sweep under another `--name` (a folder and studies of its own) or
  another `--storage`.
- `--resume` continues the sweep as it was started: the settings that decide its results
  (datasets, trials, seeds, sampler seed, every dataset's config and search space) are recorded
  in sweep_state.json at the start, and a resume with other values stops with one line naming them.
  So is the number of a dataset's trials run at once where the cluster chose it
  (`fixed_concurrency`).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from vacsr.config import DEFAULT_METHOD, flatten, shown
from vacsr.errors import ConfigError
from vacsr.folder_lock import FolderLock
from vacsr.records.sweep_state import SweepState
from vacsr.sweep.plan.folders import LOCK_FILE, state_file
from vacsr.sweep.plan.plan import (
    DRAW_SLACK,
    STARTUP_TRIALS,
    SweepPlan,
    sweep_parallelism,
    trial_slots,
)

# config keys that place or pace a run but do not change its results
RESOURCE_KEYS = ("train.cpus_per_worker", "train.progress", "data.num_workers")


class DriverLock(FolderLock):
    """flock on `<folder>/driver.lock` (vacsr/folder_lock.py), held until release() or the
    process ends."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, LOCK_FILE, "{folder}: another sweep driver is running in this "
                         "folder (pid {pid} on {host}); wait for it to end, or use another "
                         "--name or --storage")


# how the search draws and waits: --flag -> (SweepPlan field, its default)
_SEARCH_SETTINGS = {"free-running": ("free_running", False),
                    "startup-trials": ("startup_trials", STARTUP_TRIALS),
                    "draw-slack": ("draw_slack", DRAW_SLACK)}


def sweep_settings(plan: SweepPlan) -> dict[str, Any]:
    """What decides the sweep's results, as JSON-ready values."""
    def config(dataset: str) -> dict[str, str]:
        return {k: repr(v) for k, v in flatten(plan.configs[dataset]).items()
                if k not in RESOURCE_KEYS}

    # --methods is recorded where it is not VACSR alone, so a VACSR sweep's record is unchanged
    methods = {} if plan.methods == (DEFAULT_METHOD,) else {"methods": list(plan.methods)}
    # a rehearsal's records are never results: it never continues a real sweep, nor the reverse
    rehearsal = {"rehearsal": True} if plan.rehearse else {}
    # the search's settings recorded where they differ from their defaults, so an earlier
    # sweep's record is unchanged
    search = {flag: getattr(plan, field) for flag, (field, unset) in _SEARCH_SETTINGS.items()
              if getattr(plan, field) != unset}
    return {"datasets": plan.datasets, **methods, **rehearsal, "trials": plan.trials,
            "seeds": list(plan.seeds), "seed": plan.sampler_seed,
            "concurrent-trials": plan.concurrent_trials, **search,
            "configs": {d: config(d) for d in plan.datasets},
            "spaces": {d: {k: repr(v) for k, v in plan.spaces[d].items()} for d in plan.datasets}}


def _differences(recorded: dict, current: dict) -> list[str]:
    """`--flag old -> new` for the plain settings, `dataset: key` for configs and spaces."""
    diffs = [f"--{key} {shown(recorded[key], joined=True)} -> "
             f"{shown(current[key], joined=True)}"
             for key in ("datasets", "methods", "trials", "seeds", "seed", "concurrent-trials")
             if key in recorded and recorded[key] != current.get(key, [DEFAULT_METHOD])]
    for flag, (_, unset) in _SEARCH_SETTINGS.items():
        before, now = (r.get(flag, unset) for r in (recorded, current))
        if before != now:
            said = {True: "set", False: "not set"} if isinstance(unset, bool) else {}
            diffs.append(f"--{flag} {said.get(before, before)} -> {said.get(now, now)}")
    for part, label in (("configs", "config"), ("spaces", "search range")):
        for dataset, values in current[part].items():
            old = recorded.get(part, {}).get(dataset)
            if old is None or old == values:
                continue
            keys = sorted(k for k in set(old) | set(values) if old.get(k) != values.get(k))
            diffs.append(f"{dataset} {label} {', '.join(keys[:4])}"
                         + (f" (+{len(keys) - 4} more)" if len(keys) > 4 else ""))
    return diffs


def _mixed_rehearsal(plan: SweepPlan, recorded: bool) -> str:
    if recorded:
        return (f"--resume: sweep {plan.name!r} in {plan.storage} is a rehearsal; continue it "
                "with --rehearse, or run the real sweep with another --name or --storage")
    return (f"--resume --rehearse: sweep {plan.name!r} in {plan.storage} is a real sweep; a "
            "rehearsal never continues one: rehearse with another --name or --storage")


def _studies_of(plan: SweepPlan) -> list[str]:
    from vacsr.sweep.plan.studies import open_optuna_storage, study_name

    storage = open_optuna_storage(plan)
    try:
        names = {s.study_name for s in storage.get_all_studies()}
    finally:
        storage.engine.dispose()
    own = {study_name(plan.name, d) for d in plan.kind.datasets}  # a unit: <dataset>[.<method>]
    return sorted(n for n in names if n in own or n.rpartition(".")[0] in own)


def claim_state(plan: SweepPlan,
                check_files: Callable[[SweepPlan, SweepState], None]) -> SweepState:
    """The sweep's state: a fresh one for a new sweep in an unused folder, the recorded one for
    `--resume` with the same settings; ConfigError (one line) otherwise. `check_files` checks
    what the resume will read (the driver passes vacsr/sweep/search/resume_files.py's)."""
    path = state_file(plan.storage)
    settings = sweep_settings(plan)
    if not plan.resume:
        used = path.is_file() or _studies_of(plan)
        if used:
            what = f"{path}" if path.is_file() else f"Optuna studies {', '.join(used)}"
            raise ConfigError(f"{plan.storage}: holds the sweep {plan.name!r} already ({what}); "
                              "continue it with --resume, or start a new one with another "
                              "--name or --storage")
        state = SweepState(path, fresh=True)
    else:
        if not path.is_file() and _studies_of(plan):
            raise ConfigError(f"--resume: {path} is missing, but the folder holds the sweep's "
                              f"Optuna studies ({', '.join(_studies_of(plan))}); without it the "
                              "resume would open the sweep's MLflow runs a second time: restore "
                              "the file, or start a new sweep with another --name")
        state = SweepState(path, fresh=False)
        check_files(plan, state)  # a damaged file is named first, then an old format
        state.check_format()
        recorded = state.data.get("settings")
        if recorded and recorded.get("rehearsal", False) != bool(plan.rehearse):
            raise ConfigError(_mixed_rehearsal(plan, bool(recorded.get("rehearsal"))))
        diffs = _differences(recorded, settings) if recorded else []
        if diffs:
            raise ConfigError(f"--resume: sweep {plan.name!r} was started with other settings "
                              f"({'; '.join(diffs)}); resume it with the settings it started "
                              "with, or start a new sweep with another --name")
    state.update(settings=settings)
    return state


def fixed_concurrency(plan: SweepPlan, state: SweepState, resources: dict) -> SweepPlan:
    """The plan with its trials per dataset at once (N) fixed: chosen from the cluster at the
    sweep's first start (`sweep_parallelism`) and recorded, the recorded N on --resume. The
    table is a function of the command and N, so a resume never changes it; one on a cluster
    that holds fewer than N trials is refused (trial drivers could hold what their Train
    workers wait for), and so is a --concurrent-trials the cluster cannot hold."""
    recorded = state.entry(None).get("concurrent_trials")
    slots = trial_slots(plan, resources)
    if recorded is None:  # a --concurrent-trials beyond the slots is refused there
        recorded = sweep_parallelism(plan, resources)[1]
        state.update(concurrent_trials=recorded)
    if recorded > slots:
        raise ConfigError(f"--resume: the sweep runs {recorded} trials of a dataset at once "
                          f"(fixed at its start), and this cluster holds {slots}; resume it on "
                          f"a cluster that holds {recorded}")
    return replace(plan, concurrent_trials=recorded)
