"""Output folders: checked before any work, and owned by one process while it writes them.

- `check_output_folder` tells, before a model is built or data generated, whether a folder can be
  created and written (an existing file, /dev/null or a read-only place otherwise fails half-way
  with a traceback); it creates nothing.
- `FolderLock` holds an OS lock (flock) on a file in the folder for as long as a process writes
  there. The kernel drops the lock when the process dies, SIGKILL included, so a crashed owner
  never blocks the next one; a second process is refused with one line naming the owner's pid and
  host. A process may take the lock on a folder it already holds (a command and the library entry
  it calls both claim the run folder); other processes, its own Ray workers included, never take
  it: the process that starts them holds it for them.
"""
from __future__ import annotations

import fcntl
import os
import socket
import stat
import tempfile
import time
from pathlib import Path

from vacsr.atomic import STORAGE_ERRNOS
from vacsr.errors import ConfigError, StorageError
from vacsr.paths import absolute_path

# how long a refused process waits for the owner to write its pid into a fresh lock file
_HOLDER_WAIT_S = 1.0
_ACQUIRE_TRIES = 5  # the owner removed the file or its folder between our open and flock


def _kind(path: Path) -> str:
    mode = path.stat().st_mode
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a folder"


def _reason(exc: OSError) -> str:
    return STORAGE_ERRNOS.get(exc.errno or 0, exc.strerror or exc.__class__.__name__).lower()


def missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]


def check_output_folder(folder: str | Path, what: str, *, named: Path | None = None) -> Path:
    """The absolute `folder`, once it is known that it is (or can be created as) a folder this
    process can write; else one ConfigError / StorageError line naming it (or `named`, the file
    to be written there) and `what` it is for. Nothing is created: a probe file is written into
    the nearest existing folder and removed."""
    folder = absolute_path(folder)
    named = named or folder
    missing = missing_folders(folder)
    existing = missing[0].parent if missing else folder
    if not existing.is_dir():
        where = "is" if existing == named else f"cannot be created: {existing} is"
        raise ConfigError(f"{named}: {where} {_kind(existing)}; expected a folder for {what}")
    try:
        with tempfile.TemporaryFile(dir=existing):  # a real write: permission bits lie for root
            pass
    except OSError as exc:
        raise StorageError(f"{named}: cannot write ({_reason(exc)}); expected a writable "
                           f"folder for {what}") from None
    return folder


def check_output_file(path: str | Path, what: str) -> Path:
    """`check_output_folder` for the folder of a file about to be written, and the file's own
    name not taken by a folder."""
    path = absolute_path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; expected a file path for {what}")
    check_output_folder(path.parent, what, named=path)
    return path


class FolderLock:
    """flock on `<folder>/<file_name>`, held until release() or the process ends.

    `in_use` is the refusal's text, formatted with `folder`, `pid` and `host` of the owner. The
    lock file (and the folders created for it, while empty) go on release(): a folder that a
    refused or failed command created is left as it was found."""

    _held: dict[Path, list] = {}  # lock file -> [descriptor, holds] of this process

    def __init__(self, folder: str | Path, file_name: str, in_use: str) -> None:
        self.folder = absolute_path(folder)
        self.path = self.folder / file_name
        self._created: list[Path] = []
        self._holding = False
        held = FolderLock._held.get(self.path)
        if held is not None:  # this process owns the folder already
            held[1] += 1
        else:
            self._created = missing_folders(self.folder)
            FolderLock._held[self.path] = [self._acquire(in_use), 1]
        self._holding = True

    def _acquire(self, in_use: str) -> int:
        for _ in range(_ACQUIRE_TRIES):
            fd = self._open()
            if fd is None:  # the owner removed the folder it had created as we made it: again
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid, host = _holder(fd)
                os.close(fd)
                self._remove_created()
                raise ConfigError(in_use.format(folder=self.folder, pid=pid, host=host)) from None
            if _same_file(fd, self.path):  # else the owner removed it as we opened it: again
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
                return fd
            os.close(fd)
        raise ConfigError(f"{self.path}: the lock file keeps being replaced; another process "
                          "is starting and ending runs in this folder")

    def _open(self) -> int | None:
        """The lock file open for writing (created with its folder where needed)."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._remove_created()
            raise StorageError(f"{self.path}: cannot write ({_reason(exc)}); expected a "
                               "writable folder") from None

    def release(self) -> None:
        if not self._holding:
            return
        self._holding = False
        held = FolderLock._held[self.path]
        held[1] -= 1
        if held[1]:
            return
        del FolderLock._held[self.path]
        self.path.unlink(missing_ok=True)  # while still locked: see _same_file
        os.close(held[0])  # closing the descriptor drops the lock
        self._remove_created()

    def _remove_created(self) -> None:
        for folder in reversed(self._created):
            try:
                folder.rmdir()  # only while empty
            except OSError:
                return

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd`: an owner removes its lock file while it
    holds the lock, so a lock taken on a removed file guards nothing."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _holder(fd: int) -> tuple[str, str]:
    """(pid, host) the owner wrote into the lock file; '?' where it has not yet."""
    deadline = time.monotonic() + _HOLDER_WAIT_S
    while True:
        fields = os.pread(fd, 200, 0).decode(errors="replace").split()
        if len(fields) >= 2 or time.monotonic() > deadline:
            return tuple((fields + ["?", "?"])[:2])
        time.sleep(0.05)
