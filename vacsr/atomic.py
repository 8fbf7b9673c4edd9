"""One way to write a file: to a temporary name beside it, then rename.

Readers never see a partial file, a crash mid-write leaves the previous file intact, concurrent
writers (parallel trials) replace each other with whole files, and the temporary file is removed on
any failure, so a full disk is not kept full by our own leftovers. ENOSPC, EDQUOT, EIO and EROFS
become one StorageError line naming the path. A name that holds something other than a regular
file (a folder, a device such as /dev/null, a pipe, a socket) is refused before anything is
written: the rename would replace the device node itself, not write through it.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable

from vacsr.errors import StorageError

STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EIO: "input/output error",
    errno.EROFS: "read-only file system",
}

STORAGE_ADVICE = "free space or choose another output folder"

_UMASK = os.umask(0o022)  # read once (it can only be read by setting it), then restored
os.umask(_UMASK)


# what a name holds other than a regular file, in the words of the refusal
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
          (stat.S_ISSOCK, "a socket"))


def require_regular_target(path: str | Path) -> Path:
    """`path`, when it names no file yet or a regular file (through links): what a write of a
    whole file may replace. Else one StorageError line naming what it is."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise _as_storage_error(path, exc) from None
    if stat.S_ISREG(mode):
        return path
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise StorageError(f"{path}: cannot write (it is {kind}); expected a path to a regular "
                       "file or to none yet")


def temp_file_beside(path: Path, suffix: str = ".tmp") -> tuple[int, Path]:
    """A new temporary file in `path`'s folder (created if needed), open for writing: the
    descriptor and its path. Readable as `path` would be: mkstemp's 0600 would hide results from
    other users."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)
    return fd, Path(name)


def _storage_errno(exc: BaseException) -> int | None:
    """The errno of the first OSError in `exc`'s chain (torch wraps ENOSPC in a RuntimeError)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            return exc.errno
        if "No space left on device" in str(exc) or "unexpected pos" in str(exc):
            return errno.ENOSPC
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def atomic_write(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call `write(tmp_path)`, then rename the temporary file onto `path`."""
    path = require_regular_target(path)
    try:
        fd, tmp = temp_file_beside(path)
        os.close(fd)
    except OSError as exc:
        raise _as_storage_error(path, exc) from None
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        code = _storage_errno(exc)
        if code is not None:
            raise StorageError(f"{path}: cannot write ({STORAGE_ERRNOS[code]}); "
                               f"{STORAGE_ADVICE}") from None
        raise
    return path


def require_writable_folder(path: str | Path, what: str) -> Path:
    """Create `path` if needed and write (then remove) a temporary file in it, before a command
    writes anything: a read-only folder fails in one StorageError line instead of half-way. A real
    write, because permission bits say nothing for root (nor on read-only mounts)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        reason = STORAGE_ERRNOS.get(exc.errno or 0, exc.strerror or exc.__class__.__name__)
        raise StorageError(f"{path}: cannot write ({reason.lower()}); expected a writable "
                           f"folder for {what}") from None
    return path


def _as_storage_error(path: Path, exc: OSError) -> BaseException:
    reason = STORAGE_ERRNOS.get(exc.errno or 0, exc.strerror or exc.__class__.__name__)
    return StorageError(f"{path}: cannot write ({reason})")


def atomic_write_bytes(path: str | Path, payload: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(payload))


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, payload: Any) -> Path:
    return atomic_write_text(path, json.dumps(payload, indent=2))
