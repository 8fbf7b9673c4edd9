"""Cached listings of class-folder trees: a load stats ~1000 folders instead of listing ImageNet's
1.28M training files, which on a cluster's network file system takes minutes for each trial.

CoOp's ImageNet reader set the precedent: it pickles the parsed dataset to `preprocessed.pkl` once
and reads that on later runs. That file never notices a change; this cache does, cheaply:
- the tree folder is fingerprinted by one stat: adding, removing or renaming a class folder changes
  its mtime, and the class folders are then listed again;
- each class folder is fingerprinted by one stat (mtime_ns, inode, size): adding, removing or
  renaming a file changes its folder's mtime, and only changed folders are listed again;
- a folder modified less than RACY_NS before the load is not trusted (a file added within the same
  mtime tick would go unseen, git's "racy" case) and is listed again until its mtime is older.

A cached folder's names stay the one string the file stores until they are read (`Names`): an
ImageNet trial reads 16 of a class's ~1,300 names, and splitting all 1.28M cost more than the rest
of the cached load.

The file is `<folder>.listing.pkl` beside the scanned folder or, when that is not writable,
`<cache_dir>/<folder>-<hash of its resolved path>.listing.pkl` (cache_dir: the argument, else
`$VACSR_CACHE_DIR/listings`, else `~/.cache/vacsr/listings`); the newer of the two is read. A
missing, corrupt or foreign file is silently rebuilt: it is only a cache. The environment variable
VACSR_LISTING_CACHE=rebuild ignores existing files (and rewrites them); =off neither reads nor
writes them; =read reads them and writes none (a sweep's --plan: ImageNet's folders unchanged
since the last run are not listed again).
"""
from __future__ import annotations

import hashlib
import os
import pickle
import time
import warnings
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence, overload

from vacsr.atomic import atomic_write_bytes
from vacsr.data.checked_io import files_in, subdirs
from vacsr.errors import StorageError

# Part of the key: bump when the listing rule changes (files_in: non-hidden files, sorted).
LISTING_VERSION = "vacsr-listing/2"
RACY_NS = 2_000_000_000  # coarser than any file system's mtime tick (FAT: 2 s, old NFS: 1 s)
SEPARATOR = "\0"  # cannot occur in a file name; one string per folder reads back 2x faster

Fingerprint = tuple[int, int, int]
Entry = tuple[Fingerprint | None, str, int]  # (fingerprint, names joined by SEPARATOR, count)


class Names(Sequence[str]):
    """One folder's sorted file names, split out of the joined string on first read."""

    __slots__ = ("_joined", "_names", "_count")

    def __init__(self, joined: str = "", names: list[str] | None = None,
                 count: int | None = None) -> None:
        self._joined, self._names = joined, names
        if count is None:
            count = len(names) if names is not None else (
                joined.count(SEPARATOR) + 1 if joined else 0)
        self._count = count

    def joined(self) -> str:
        return self._joined if self._names is None else SEPARATOR.join(self._names)

    def _list(self) -> list[str]:
        if self._names is None:
            self._names = self._joined.split(SEPARATOR) if self._joined else []
        return self._names

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index):
        return self._list()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._list())

    def __contains__(self, name: object) -> bool:
        names = self._list()  # sorted (files_in): a bisection, not a set of every name
        at = bisect_left(names, name) if isinstance(name, str) else len(names)
        return at < len(names) and names[at] == name

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Names, list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        return f"Names({self._list()!r})"


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
    """One stat of a folder; None when it is missing or was modified too recently."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    if stat.st_mtime_ns > now_ns - RACY_NS:
        return None
    return stat.st_mtime_ns, stat.st_ino, stat.st_size


@dataclass
class CachedTree:
    """What the cache file holds for one tree."""

    root_print: Fingerprint | None = None  # the tree folder's own fingerprint
    subdirs: list[str] | None = None  # its sorted class folders, valid while root_print holds
    folders: dict[str, Entry] = field(default_factory=dict)


class _PlainData(pickle.Unpickler):
    """A cache holds only dicts, lists, tuples, strings and ints: refuse any class (no code
    runs)."""

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


def read_cache(path: Path, key: str) -> CachedTree:
    """The cached listing of the tree `key`; empty for a missing, corrupt or foreign file."""
    try:
        with open(path, "rb") as handle:
            data = _PlainData(handle).load()
        if data["format"] == LISTING_VERSION and data["root"] == key:
            root_print, subdirs, folders = data["root_print"], data["subdirs"], data["folders"]
            if (isinstance(folders, dict) and isinstance(root_print, (tuple, type(None)))
                    and (subdirs is None or (isinstance(subdirs, list)
                                             and all(type(n) is str for n in subdirs)))):
                return CachedTree(root_print, subdirs, folders)
    except Exception:  # truncated, garbage, wrong shape, unreadable: all mean "rebuild"
        pass
    return CachedTree()


def write_cache(paths: Sequence[Path], key: str, tree: CachedTree) -> Path | None:
    """Write beside the data, else in the cache folder; None (and a warning) when neither works."""
    payload = pickle.dumps({"format": LISTING_VERSION, "root": key, "root_print": tree.root_print,
                            "subdirs": tree.subdirs, "folders": tree.folders},
                           protocol=pickle.HIGHEST_PROTOCOL)
    for path in paths:
        try:
            return atomic_write_bytes(path, payload)
        except (OSError, StorageError):
            continue
    warnings.warn(f"{paths[-1]}: could not write the folder listing cache; the next load lists "
                  "the folders again", stacklevel=3)
    return None


def _read_folders(root: Path, folders: Sequence[str], cached: dict[str, Entry], now_ns: int
                  ) -> tuple[dict[str, Entry], dict[str, Names]]:
    """(entries to cache, listing): each folder from its cache entry if unchanged, else listed.

    One stat per folder is all an unchanged tree costs, so the loop is kept to that: the stat is
    by name relative to the open tree, and the fingerprint test is written out.
    """
    try:
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY) if os.stat in os.supports_dir_fd \
            else None
    except OSError:
        dir_fd = None
    prefix = "" if dir_fd is not None else os.path.join(root, "")
    trusted_ns = now_ns - RACY_NS
    entries: dict[str, Entry] = {}
    listing: dict[str, Names] = {}
    try:
        for name in folders:
            entry = cached.get(name)
            # Stat before listing: a file added while the folder is listed changes the mtime
            # after the fingerprint was taken, so the next load lists the folder again.
            try:
                stat = os.stat(prefix + name, dir_fd=dir_fd)
                current = ((stat.st_mtime_ns, stat.st_ino, stat.st_size)
                           if stat.st_mtime_ns <= trusted_ns else None)
            except OSError:
                current = None
            if (current is not None and type(entry) is tuple and len(entry) == 3
                    and entry[0] == current and type(entry[1]) is str
                    and type(entry[2]) is int):
                listing[name] = Names(entry[1], count=entry[2])
            else:
                listing[name] = Names(names=files_in(root / name))
                entry = (current, listing[name].joined(), len(listing[name]))
            entries[name] = entry
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    return entries, listing


def list_tree(root: Path, folders: Sequence[str] | None = None, *,
              cache_dir: str | Path | None = None) -> dict[str, Names]:
    """Class folder -> sorted file names (`files_in`) for each of `folders` (default: the sorted
    sub-folders of `root`), in that order; read from the cache for every unchanged folder.

    Errors are those of listing the folders directly (a missing folder is listed, and fails).
    """
    mode = os.environ.get("VACSR_LISTING_CACHE", "")
    key = str(root.resolve())
    paths = cache_paths(Path(key), cache_dir)
    newest = None if mode in ("off", "rebuild") else _newest(paths)
    cached = read_cache(newest, key) if newest is not None else CachedTree()
    now_ns = time.time_ns()
    # The tree's own mtime moves when a class folder is added, removed or renamed: while its
    # fingerprint holds, the cached folder list does too (taken before listing, as below).
    root_print = fingerprint(key, now_ns)
    same_root = root_print is not None and root_print == cached.root_print
    subdir_list = cached.subdirs if same_root else None
    if folders is None:
        if subdir_list is None:
            subdir_list = subdirs(root)
        folders = subdir_list
    entries, listing = _read_folders(root, folders, cached.folders, now_ns)
    tree = CachedTree(root_print, subdir_list, entries)
    if mode not in ("off", "read") and tree != cached:
        write_cache(paths, key, tree)
    return listing
