"""Recovering from a full disk or a tracking outage: the room kept to close the records, the
classification of a failure, and the repair of a Tune folder before `--resume`.

Room kept in the sweep folder so that a full disk can still close the sweep's records. A full
disk stops every writer at once, the driver's record keeping included: the SQLite files of MLflow
and Optuna in the sweep folder need room for their journals to mark runs KILLED and trials FAIL,
and sweep_state.json is written whole. So while a driver runs it holds
`<sweep folder>/.space-reserve` (RESERVE_BYTES, allocated, not sparse); when a storage error
stops the sweep it removes that file first and closes its records in the room it frees. A
`--resume` allocates it again, and stops with one line while the disk is still full.

What a failed write leaves in a Tune experiment folder is cleared before `--resume` restores
it. A full disk (or a quota) mid-trial leaves zero-byte files where Tune was writing: its restore
then stops on them for good (an empty `error.pkl` ends in `EOFError: Ran out of input` when the
results are read). Empty pickles and JSON files are never valid, so they are removed (Tune falls
back to `error.txt` for an error); and trials that errored on a storage error are resumed from
their checkpoints, since freeing space removes their cause (so are trials whose MLflow server
stopped answering, once it is back); other errors stay final: the same config and seed fail
again. A checkpoint that Tune's saved state names but that Tune had already deleted gets one of
the trial's newer checkpoints (restore_named_checkpoints).
"""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from vacsr.atomic import STORAGE_ADVICE, STORAGE_ERRNOS
from vacsr.errors import StorageError
from vacsr.sweep.plan.folders import RESERVE_FILE

RESERVE_BYTES = 4 * 2**20  # MLflow's and Optuna's journals for a few hundred row updates

# a full, quota-limited or failing disk: what freeing space (or another try) cures
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO)
# what such an error says: the OSError text, vacsr's StorageError line (vacsr/atomic.py), SQLite's
STORAGE_ERROR_TEXTS = (*(os.strerror(code) for code in _SPACE_ERRNOS),
                       *(STORAGE_ERRNOS[code] for code in _SPACE_ERRNOS),
                       "database or disk is full")

_ERROR_CLASS = re.compile(r"^[\w.]+(Error|Exception): ")  # "vacsr.errors.StorageError: ..."


# what MLflow's REST client says when its server does not answer (connection refused, a timeout,
# a gateway's 5xx): a restarted server cures it, as freeing space cures a full disk
TRACKING_DOWN = re.compile(r"API request to (?:endpoint )?(\S+?) failed with "
                           r"(?:exception|error code 5\d\d)")
# ... and what vacsr's own check of the store says then (vacsr/records/uri.py)
TRACKING_CHECK_DOWN = re.compile(r"MLflow tracking URI (\S+): (?:server not answering|"
                                 r"server answered HTTP 5\d\d)")
TRACKING_DOWN_NOTE = "the MLflow server did not answer"  # how vacsr passes such an error on
_NOTED = re.compile(re.escape(TRACKING_DOWN_NOTE) + r" \((no answer[^)]*)\)")


def _error_lines(error: BaseException | str) -> list[str]:
    """The lines of `error`'s text and of its chain of causes (a remote traceback included)."""
    seen, texts = 0, []
    while isinstance(error, BaseException) and seen < 8:
        texts.append(str(error))
        if isinstance(error, OSError) and error.errno in _SPACE_ERRNOS:
            texts.append(os.strerror(error.errno))
        error = error.__cause__ or error.__context__
        seen += 1
    if isinstance(error, str):
        texts.append(error)
    return "\n".join(texts).splitlines()


def storage_failure(error: BaseException | str) -> str | None:
    """The first line of `error` (its text, or its chain of causes) that says the disk is full
    or failing; None when it says nothing of the kind."""
    for line in _error_lines(error):
        if any(marker in line for marker in STORAGE_ERROR_TEXTS):
            line = _ERROR_CLASS.sub("", line.strip()).removesuffix(f"; {STORAGE_ADVICE}")
            return line[:300]
    return None


def tracking_failure(error: BaseException | str) -> str | None:
    """"no answer from <server>" when `error` (or its chain) says the MLflow server did not
    answer a request; None otherwise."""
    from urllib.parse import urlsplit

    for line in _error_lines(error):
        noted = _NOTED.search(line)
        if noted:
            return noted.group(1)
        match = TRACKING_DOWN.search(line) or TRACKING_CHECK_DOWN.search(line)
        if match:
            url = urlsplit(match.group(1))
            where = f"{url.scheme}://{url.hostname}:{url.port}"
            return f"no answer from {where}" if url.hostname else "no answer"
    return None


def outage(error: BaseException | str) -> str | None:
    """What stopped a write or a request that another try cures once the disk has room or the
    tracking server is back; None when `error` is the run's own."""
    return storage_failure(error) or tracking_failure(error)


def _allocate(fd: int, size: int) -> None:
    """`size` bytes of real blocks: fallocate, or zeros where the filesystem cannot (NFS)."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
    block = bytes(1 << 20)
    for offset in range(0, size, len(block)):
        os.pwrite(fd, block[:size - offset], offset)
    os.fsync(fd)


class SpaceReserve:
    """RESERVE_BYTES held in `folder` until release()."""

    def __init__(self, folder: Path, size: int = RESERVE_BYTES) -> None:
        self.path, self.size = Path(folder) / RESERVE_FILE, size

    def hold(self) -> None:
        """Allocate the reserve (again); StorageError (one line) when the disk has no room."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                _allocate(fd, self.size)
            finally:
                os.close(fd)
        except OSError as exc:
            self.path.unlink(missing_ok=True)
            reason = os.strerror(exc.errno) if exc.errno else type(exc).__name__
            raise StorageError(f"{self.path}: cannot write ({reason.lower()}); free space in "
                               "the sweep folder, then run the sweep again") from None

    def release(self) -> None:
        """Give the room back to the disk (the records about to be closed need it)."""
        self.path.unlink(missing_ok=True)


def clear_empty_files(folder: Path) -> list[Path]:
    """Remove the zero-byte .pkl / .json files under `folder`; returns them."""
    removed = []
    for path in sorted(folder.rglob("*")):
        if path.suffix in (".pkl", ".json") and path.is_file() and path.stat().st_size == 0:
            path.unlink()
            removed.append(path)
    return removed


def failed_on_outage(folder: Path) -> bool:
    """True when a trial of the experiment errored on a storage error or on a tracking server
    that did not answer (its error.txt says): another try cures both."""
    for path in folder.rglob("error.txt"):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if outage(text):
            return True
    return False


def repair_experiment(folder: str) -> bool:
    """Clear a local experiment folder for restore; True when its errored trials should resume
    (they failed on storage or on the tracking server). A URI (s3://...) is left as it is:
    object stores write whole objects or none."""
    if "://" in folder or not Path(folder).is_dir():
        return False
    clear_empty_files(Path(folder))
    return failed_on_outage(Path(folder))


def _whole_checkpoints(trial_folder: Path, checkpoint_file: str) -> list[Path]:
    """The trial's checkpoint folders that hold `checkpoint_file`, oldest first (Tune names them
    checkpoint_000000, checkpoint_000001, ...)."""
    return sorted(path for path in trial_folder.glob("checkpoint_*")
                  if (path / checkpoint_file).is_file())


def restore_named_checkpoints(results, checkpoint_file: str) -> list[str]:
    """Give every local checkpoint a restored Tune experiment's saved state names the folder it
    names; one line per trial repaired. `results`: the restored Tuner's `get_results()`.

    Tune deletes a trial's older checkpoints (`CheckpointConfig.num_to_keep`) when it registers
    a new one, but saves its experiment state only now and then: a driver stopped in between
    (SIGKILL, a lost head node) leaves a state whose trial's latest checkpoint is gone. Tune's
    restore of that trial then fails ("does not exist on storage anymore"), its Optuna trial
    gets no value and the search draws otherwise from there on. The trial folder still holds
    the newer checkpoints the trial wrote after that state: the newest whole one is moved to the
    path the state names and the trial resumes from it (runs are seeded, so the epochs it
    starts from are those a clean run computed). With none left, the named folder is made empty:
    the run trains again from its first epoch (vacsr/distributed/ray_hooks.py, read_or_restart).
    An older checkpoint the state keeps and the disk lacks gets an empty folder for Tune to
    delete when it rotates its checkpoints."""
    repaired = []
    for result in results:
        latest = result.checkpoint
        if latest is None or "://" in latest.path:
            continue  # no checkpoint yet, or an object store (written whole, deleted by Tune)
        named = Path(latest.path)
        if not named.exists():
            newer = _whole_checkpoints(named.parent, checkpoint_file)
            if newer:
                os.rename(newer[-1], named)
                repaired.append(f"{named.parent.name}: Tune's state names {named.name}, which "
                                f"it had deleted; the trial resumes from {newer[-1].name}")
            else:
                named.mkdir(parents=True)
                repaired.append(f"{named.parent.name}: Tune's state names {named.name}, which "
                                "it had deleted, and no newer checkpoint is whole; the trial "
                                "trains again from its first epoch")
        for kept, _ in result.best_checkpoints or []:
            if "://" not in kept.path:
                Path(kept.path).mkdir(parents=True, exist_ok=True)
    return repaired
