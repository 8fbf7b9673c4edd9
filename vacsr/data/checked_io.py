"""File-system helpers shared by the dataset loaders: every failure becomes one DataError line.

Loaders read user-owned folders, so a missing folder, a malformed JSON or a split entry pointing at
a missing image must name the path and what was expected, instead of surfacing a json/PIL traceback
deep inside a DataLoader worker.
"""
from __future__ import annotations

import errno
import json
import os
import pickle
from pathlib import Path
from typing import Any, Iterable

from vacsr.atomic import atomic_write_bytes
from vacsr.errors import DataError


def require_dir(path: Path, expected: str) -> Path:
    """Return `path` if it is a folder, else raise DataError saying what should be there."""
    if not path.is_dir():
        raise DataError(f"{path}: folder not found; expected {expected}")
    return path


def require_file(path: Path, expected: str) -> Path:
    if not path.is_file():
        raise DataError(f"{path}: file not found; expected {expected}")
    return path


def read_json(path: Path, expected: str) -> Any:
    """Parse a JSON file, or raise DataError naming the file, the position and the expectation."""
    require_file(path, expected)
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}); "
                        f"expected {expected}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: unreadable ({exc.__class__.__name__}); "
                        f"expected {expected}") from None


def read_lines(path: Path, expected: str) -> list[str]:
    """Non-empty, stripped lines of a text file."""
    require_file(path, expected)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: unreadable ({exc.__class__.__name__}); "
                        f"expected {expected}") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def dataset_path(path: str, source: Path | str, where: str) -> str:
    """A path a dataset's own file lists (split JSON, Karpathy JSON, Aircraft's image lists),
    checked to stay inside the dataset folder: relative and without '..' parts.

    The check is on the text, not on the resolved path, so that symbolic links the user placed
    inside the folder (an image folder on another disk) keep working; '..' is refused outright
    because after a symbolic link it climbs from the link's target, not from the folder.
    """
    if path.startswith("/") or ".." in path.split("/"):
        raise DataError(f"{source}: {where} names {path!r}, outside the dataset folder; expected "
                        "a path relative to the dataset's image folder, without '..' parts")
    return path


def _listing(path: Path, keep) -> list[str]:
    """Sorted non-hidden names of `path` whose entry passes `keep`; a symbolic link loop (the
    folder itself or an entry) becomes one DataError naming it."""
    names = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                try:
                    if keep(entry):
                        names.append(entry.name)
                except OSError as exc:
                    raise _unlistable(Path(entry.path), exc) from None
    except OSError as exc:
        raise _unlistable(path, exc) from None
    return sorted(names)


def _unlistable(path: Path, exc: OSError) -> DataError:
    if exc.errno == errno.ELOOP:
        return DataError(f"{path}: symbolic link loop; expected an image file or a class folder "
                         "(remove or fix the link)")
    return DataError(f"{path}: cannot be listed ({exc.strerror or exc.__class__.__name__}); "
                     "expected a readable folder")


def subdirs(path: Path) -> list[str]:
    """Sorted names of the non-hidden sub-folders (sorted so that labels never depend on the FS)."""
    return _listing(path, lambda entry: entry.is_dir())


def files_in(path: Path) -> list[str]:
    """Sorted names of the non-hidden files of a folder.

    CoOp lists with os.listdir (file-system order); sorting makes the item order, and hence the
    seeded few-shot sample, identical on every machine.
    """
    return _listing(path, lambda entry: entry.is_file())


def check_files_exist(paths: Iterable[Path], source: str) -> None:
    """Raise DataError for the first path that does not exist.

    One listdir per parent folder instead of one stat per file: a 50,000-image test split on a
    network file system is checked in a fraction of a second.
    """
    listing: dict[Path, set[str] | None] = {}
    for path in paths:
        parent = path.parent
        if parent not in listing:
            try:
                listing[parent] = set(os.listdir(parent))
            except OSError:
                listing[parent] = None
        names = listing[parent]
        if names is None or path.name not in names:
            raise DataError(f"{path}: image file not found (listed in {source}); "
                            "expected the image the split file names")


def atomic_pickle(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
