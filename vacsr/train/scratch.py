"""Temporary copies a run makes live in its own output folder, not in the node's /tmp: the
checkpoint it hands Ray each epoch, and a checkpoint read back from Ray's storage. A process
killed while one exists (a preempted worker, a stopped job) leaves it where the run's records
are, and the next start in that folder clears it: `vacsr train` before it trains, a sweep's
`--resume` before Ray starts (no run is training then). In /tmp they stayed for good, a model's
checkpoint per killed process (1.8 GB for ViT-B/32).
"""
from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

SCRATCH_PREFIX = ".scratch-"


@contextmanager
def scratch_folder(output_dir: str | Path) -> Iterator[Path]:
    """A fresh folder inside the run folder `output_dir`, removed as the block ends."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX, dir=folder) as scratch:
        yield Path(scratch)


def clear_scratch(*roots: str | Path) -> list[Path]:
    """Remove the scratch folders killed processes left in the run folders under `roots` (a run
    folder, or the folders holding a sweep's runs); call only while no run there is training.
    Returns what it removed."""
    left = [folder for root in roots if Path(root).is_dir()
            for folder in Path(root).rglob(f"{SCRATCH_PREFIX}*") if folder.is_dir()]
    for folder in left:
        shutil.rmtree(folder, ignore_errors=True)
    return left
