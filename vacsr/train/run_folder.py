"""A run folder remembers what it was trained with.

`vacsr train` continues a run from `train.output_dir` (train.resume): with other settings the
checkpoint, its metrics and the config written beside them would disagree, and the old metrics
would be printed as the new run's. So the stored config (the checkpoint's, else config.yaml) is
compared with the new one first: a key that changes training stops the run with one line naming
it; evaluation-only keys are allowed and said; where and how the run is placed (folders, Ray,
workers, tracking) may change freely.

A run folder belongs to one process while it trains there (`claim_run_folder`, a FolderLock on
train.lock): a second `vacsr train` into it would train beside the first and mix their records.
The process that starts a run holds the lock (`vacsr train`, locally or as the driver of its Ray
Train workers, and `train()`), never the Ray workers that write the folder on its behalf. A
sweep's trial and final-run folders lie in its sweep folder, which its driver holds.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from vacsr.config import Config, flat_dict, flatten, shown
from vacsr.errors import ConfigError
from vacsr.folder_lock import FolderLock, check_output_folder
from vacsr.train.run_files import CHECKPOINT_FILE, CONFIG_FILE, LOCK_FILE

# keys that change only what is evaluated and shown, not what is trained
EVALUATION_KEYS = ("train.eval_every", "train.eval_test", "train.progress", "data.num_workers")
# keys that place the run (its folders, runtime, worker count, recovery, MLflow run)
PLACEMENT_KEYS = ("train.output_dir", "train.resume", "train.ray", "train.workers",
                  "train.cpus_per_worker", "train.max_failures", "train.storage_path",
                  "tracking.enabled", "tracking.uri", "tracking.experiment",
                  "tracking.run_name", "tracking.parent_run_id")
# what a run that cannot continue the run in its folder may do instead
FRESH_OPTIONS = "another train.output_dir, or train.resume=false to start afresh"
FRESH_START = f"use {FRESH_OPTIONS}"
RESUME_HINT = f"pass the same value, {FRESH_OPTIONS}"  # a resumed checkpoint of another model
IN_USE = ("{folder}: another vacsr train is running in this folder (pid {pid} on {host}); wait "
          "for it to end, or use another train.output_dir")


def _flat(nested: Any) -> dict[str, Any] | None:
    return flat_dict(nested) if isinstance(nested, dict) else None


def stored_config(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """(the file, the flattened config) the run in `folder` was trained with: the checkpoint's
    own config, else config.yaml beside it; None for a folder without a checkpoint."""
    checkpoint = folder / CHECKPOINT_FILE
    if not checkpoint.is_file():
        return None
    from vacsr.train.checkpoint import load_checkpoint

    stored = _flat(load_checkpoint(checkpoint).get("config"))
    if stored is not None:
        return checkpoint, stored
    path = folder / CONFIG_FILE
    try:  # a checkpoint that does not store its config
        stored = _flat(yaml.safe_load(path.read_text()))
    except (OSError, yaml.YAMLError):
        return None
    return (path, stored) if stored is not None else None


def check_run_folder(config: Config) -> None:
    """ConfigError naming the training keys on which `config` differs from the run already in
    its output folder; a note on stderr for evaluation-only keys. Nothing to check for a new
    folder or train.resume=false."""
    if not config.train.resume:
        return
    found = stored_config(Path(config.train.output_dir).expanduser().resolve())
    if found is None:
        return
    source, stored = found
    current = flatten(config)
    differing = [k for k in current if k in stored and stored[k] != current[k]
                 and k not in PLACEMENT_KEYS]
    changes = {k: f"{k}={shown(stored[k])} (this config has {shown(current[k])})"
               for k in differing}
    trained = [changes[k] for k in differing if k not in EVALUATION_KEYS]
    if trained:
        raise ConfigError(f"{source}: trained with other settings: {', '.join(trained)}; "
                          f"{FRESH_START}")
    if differing:
        print(f"vacsr: note: {source}: continuing the run with other evaluation-only settings: "
              f"{', '.join(changes.values())}", file=sys.stderr)


def run_folder(config: Config) -> Path:
    return Path(config.train.output_dir).expanduser().resolve()


def check_run_output(config: Config) -> Path:
    """The run folder, once it is known that it is (or can be created as) a writable folder;
    nothing is created (a file, /dev/null or a read-only place is one line, before any work)."""
    return check_output_folder(run_folder(config), "the run (train.output_dir)")


def lock_run_folder(config: Config) -> FolderLock:
    """This process's hold on the run folder until release(); one line naming the owner when
    another process trains there."""
    return FolderLock(run_folder(config), LOCK_FILE, IN_USE)


@contextmanager
def claim_run_folder(config: Config):
    """Check the run folder, hold it, and check the run already in it (check_run_folder) while
    held, so that no other process starts or changes it in between; yields the folder."""
    folder = check_run_output(config)
    with lock_run_folder(config):
        check_run_folder(config)
        yield folder
