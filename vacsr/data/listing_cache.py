"""Cached listings of class-folder trees: a load stats ~1000 folders instead of listing ImageNet's
1.28M training files, which on a cluster's network file system takes minutes for each trial.

CoOp's ImageNet reader set the precedent: it pickles the parsed dataset to `preprocessed.pkl` once
and reads that on later runs. That file never notices a change; this cache does, cheaply:
- the class folders are listed on every load (one scandir of the root), so an added or removed
  class folder is always seen;
- each class folder is fingerprinted by one stat (mtime_ns, inode, size): adding, removing or
  renaming a file changes its folder's mtime, and only changed folders are listed again;
- a folder modified less than RACY_NS before the load is not trusted (a file added within the same
  mtime tick would go unseen, git's "racy" case) and is listed again until its mtime is older.

The file is `<folder>.listing.pkl` beside the scanned folder or, when that is not writable,
`<cache_dir>/<folder>-<hash of its resolved path>.listing.pkl` (cache_dir: the argument, else
`$VACSR_CACHE_DIR/listings`, else `~/.cache/vacsr/listings`); the newer of the two is read. A
missing, corrupt or foreign file is silently rebuilt: it is only a cache. The environment variable
VACSR_LISTING_CACHE=rebuild ignores existing files (and rewrites them); =off neither reads nor
writes them.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import time
import warnings
from pathlib import Path
from typing import Sequence

from vacsr.atomic import atomic_write_bytes
from vacsr.data.files import files_in, subdirs
from vacsr.errors import StorageError

# Part of the key: bump when the listing rule changes (files_in: non-hidden files, sorted).
LISTING_VERSION = "vacsr-listing/1"
RACY_NS = 2_000_000_000  # coarser than any file system's mtime tick (FAT: 2 s, old NFS: 1 s)
SEPARATOR = "\0"  # cannot occur in a file name; one string per folder reads back 2x faster

Fingerprint = tuple[int, int, int]
Entry = tuple[Fingerprint | None, str]  # (fingerprint, file names joined by SEPARATOR)


def default_cache_dir() -> Path:
    base = os.environ.get("VACSR_CACHE_DIR")
    return Path(base) / "listings" if base else Path.home() / ".cache" / "vacsr" / "listings"


def cache_paths(root: Path, cache_dir: str | Path | None = None) -> tuple[Path, Path]:
    """(file beside the data, file in the cache folder) for the resolved folder `root`."""
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:16]
    fallback = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return (root.parent / f"{root.name}.listing.pkl",
            fallback / f"{root.name}-{digest}.listing.pkl")


def fingerprint(path: str, now_ns: int) -> Fingerprint | None:
    """One stat of a class folder; None when it is missing or was modified too recently."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    if stat.st_mtime_ns > now_ns - RACY_NS:
        return None
    return stat.st_mtime_ns, stat.st_ino, stat.st_size


class _PlainData(pickle.Unpickler):
    """A cache holds only dicts, tuples, strings and ints: refuse any class (no code runs)."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"unexpected object {module}.{name}")


def _newest(paths: Sequence[Path]) -> Path | None:
    found = []
    for path in paths:
        try:
            found.append((os.stat(path).st_mtime_ns, str(path)))
        except OSError:
            continue
    return Path(max(found)[1]) if found else None


def read_cache(path: Path, key: str) -> dict[str, Entry]:
    """The cached folders of the tree `key`; {} for a missing, corrupt or foreign file."""
    try:
        with open(path, "rb") as handle:
            data = _PlainData(handle).load()
        if data["format"] == LISTING_VERSION and data["root"] == key:
            folders = data["folders"]
            return folders if isinstance(folders, dict) else {}
    except Exception:  # truncated, garbage, wrong shape, unreadable: all mean "rebuild"
        pass
    return {}


def write_cache(paths: Sequence[Path], key: str, folders: dict[str, Entry]) -> Path | None:
    """Write beside the data, else in the cache folder; None (and a warning) when neither works."""
    payload = pickle.dumps({"format": LISTING_VERSION, "root": key, "folders": folders},
                           protocol=pickle.HIGHEST_PROTOCOL)
    for path in paths:
        try:
            return atomic_write_bytes(path, payload)
        except (OSError, StorageError):
            continue
    warnings.warn(f"{paths[-1]}: could not write the folder listing cache; the next load lists "
                  "the folders again", stacklevel=3)
    return None


def _usable(entry: object, current: Fingerprint | None) -> bool:
    return (current is not None and isinstance(entry, tuple) and len(entry) == 2
            and entry[0] == current and isinstance(entry[1], str))


def list_tree(root: Path, folders: Sequence[str] | None = None, *,
              cache_dir: str | Path | None = None) -> dict[str, list[str]]:
    """Class folder -> sorted file names (`files_in`) for each of `folders` (default: the sorted
    sub-folders of `root`), in that order; read from the cache for every unchanged folder.

    Errors are those of listing the folders directly (a missing folder is listed, and fails).
    """
    folders = subdirs(root) if folders is None else folders
    mode = os.environ.get("VACSR_LISTING_CACHE", "")
    key = str(root.resolve())
    paths = cache_paths(Path(key), cache_dir)
    newest = None if mode in ("off", "rebuild") else _newest(paths)
    cached = read_cache(newest, key) if newest is not None else {}
    now_ns = time.time_ns()
    prefix = os.path.join(root, "")  # one str conversion, not one per folder
    entries: dict[str, Entry] = {}
    listing: dict[str, list[str]] = {}
    for name in folders:
        entry = cached.get(name)
        # Stat before listing: a file added while the folder is listed changes the mtime after
        # the fingerprint was taken, so the next load lists the folder again.
        current = fingerprint(prefix + name, now_ns)
        if _usable(entry, current):
            listing[name] = entry[1].split(SEPARATOR) if entry[1] else []
        else:
            listing[name] = files_in(root / name)
            entry = (current, SEPARATOR.join(listing[name]))
        entries[name] = entry
    if mode != "off" and entries != cached:
        write_cache(paths, key, entries)
    return listing
