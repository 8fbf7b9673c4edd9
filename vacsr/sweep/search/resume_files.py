"""What `--resume` reads of each unfinished dataset's search, checked before Ray starts: its
recorded selection, and Tune's experiment state in a local Ray storage."""
from __future__ import annotations

import json
from pathlib import Path

from vacsr.errors import ConfigError
from vacsr.records.sweep_state import SweepState
from vacsr.sweep.plan.folders import TUNE, trial_folder, tune_experiment
from vacsr.sweep.plan.plan import SweepPlan
from vacsr.sweep.search.selection import read_selection


def check_resume_files(plan: SweepPlan, state: SweepState) -> None:
    """ConfigError (one line) naming the first damaged file. A zero-byte file of Tune's is what
    a full disk leaves and is cleared by vacsr/sweep/search/recovery.py; anything else
    unreadable stops here."""
    for dataset in plan.datasets:
        if state.dataset(dataset).get("done"):
            continue
        read_selection(trial_folder(plan.storage, dataset))  # ConfigError when damaged
        run_id = state.dataset(dataset).get("run_id")
        if not run_id or "://" in str(plan.ray_root):
            continue
        folder = Path(plan.ray_path(TUNE, tune_experiment(dataset, run_id)))
        if not folder.is_dir():
            continue
        for file in sorted(folder.glob("experiment_state-*.json")):
            try:
                ok = file.stat().st_size == 0 or isinstance(json.loads(file.read_text()), dict)
            except (OSError, ValueError, UnicodeDecodeError):
                ok = False
            if not ok:
                raise ConfigError(f"--resume: {file}: Tune's experiment state is damaged (not a "
                                  "JSON object); restore the file, or start a new sweep with "
                                  "another --name")
