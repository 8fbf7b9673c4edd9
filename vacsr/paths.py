"""A path as vacsr keeps it: absolute and user-expanded, without following symlinks (the folder
may not exist yet, and a link the user named stays the name shown in messages)."""
from __future__ import annotations

import os
from pathlib import Path


def absolute_path(path: str | os.PathLike) -> Path:
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
