"""Checkpoints: written atomically (temp file, then rename), read back with weights_only=True."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from vacsr.errors import CheckpointError


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write `state` to `path`; a crash mid-write leaves the previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for truncated or foreign files
        raise CheckpointError(f"{path}: not a readable vacsr checkpoint "
                              f"({exc.__class__.__name__})") from None
