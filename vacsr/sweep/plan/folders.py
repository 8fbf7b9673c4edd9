"""Where a sweep keeps things: its folder (state, reports, best configs, data), and Ray's storage
(Tune/Train experiments and checkpoints), a local path or an s3:// gs:// file:// URI."""
from __future__ import annotations

import os
from pathlib import Path

from vacsr.atomic import atomic_write


def sweep_folder(root: str | os.PathLike, name: str) -> Path:
    return Path(root).expanduser().resolve() / name


def prefix_cache_folder(storage: Path, dataset: str) -> Path:
    """Where a dataset's runs keep their evaluation passes' frozen-prefix outputs
    (data.prefix_cache_dir): every trial and final seed of the dataset on a node that sees the
    sweep folder shares it."""
    return storage / "prefix_cache" / dataset


def join_storage(root: str, *parts: str) -> str:
    """`root`/parts for a local path or a URI (s3://, gs://, file://): pyarrow takes both."""
    if "://" in root:
        return "/".join([root.rstrip("/"), *parts])
    return str(Path(root, *parts))


def storage_filesystem(root: str):
    """The pyarrow filesystem `root` (a local path or an s3:// gs:// file:// URI) lives on."""
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(root)[0] if "://" in root else pafs.LocalFileSystem()


def copy_from_storage(root: str, path: str, dest: Path) -> Path:
    """Copy `path` (a file on the storage `root` lives on, as Ray Train reports it) to `dest`."""
    import pyarrow.fs as pafs

    def copy(tmp: Path) -> None:
        pafs.copy_files(path, str(tmp), source_filesystem=storage_filesystem(root),
                        destination_filesystem=pafs.LocalFileSystem())

    return atomic_write(dest, copy)
