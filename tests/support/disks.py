"""A disk a test can fill for real: folders on tmpfs mounts of their own (the `small_disk` fixture
in tests/conftest.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


class SmallDisk:
    """Folders on tmpfs mounts of their own, so that a test can fill a disk for real."""

    def __init__(self) -> None:
        self.mounted: list[Path] = []

    def mount(self, folder: Path, size: int) -> Path:
        """`folder` on a tmpfs of `size` bytes; skips the test where that needs what it lacks."""
        import subprocess

        folder.mkdir(parents=True, exist_ok=True)
        done = os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
            capture_output=True).returncode == 0
        if not done:
            pytest.skip("cannot mount a small tmpfs here (needs root with mount)")
        self.mounted.append(folder)
        return folder

    @staticmethod
    def fill(folder: Path) -> Path:
        """Zeros written into `folder` until its disk is full; returns the filler file."""
        filler = folder / "filler"
        with open(filler, "wb", buffering=0) as handle:
            for block in (bytes(1 << 20), bytes(4096)):  # then the last partial megabyte
                try:
                    while True:
                        handle.write(block)
                except OSError:
                    pass
        return filler
