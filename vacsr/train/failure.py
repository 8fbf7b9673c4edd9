"""A Ray run's own error, recorded in its output folder (FAILED_FILE) and read back: the one
writer and the one reader of that record.

Ray Train retries a run whose worker is lost; an error of the run itself (bad data, a diverged
loss) would fail the same way again, so the worker records it and returns, and the caller (the
run's driver, or the trial actor that a Tune retry starts again) raises it. The record is written
atomically, so one that cannot be read was changed by something else: it is said in one line
naming the file, by every reader alike, and never taken for a run that did not fail.
"""
from __future__ import annotations

import json
from pathlib import Path

from vacsr.atomic import atomic_write_json
from vacsr.errors import RunFailed
from vacsr.train.run_files import FAILED_FILE

RECORD_EXPECTED = 'a JSON object {"error": <one line>, "type": <exception class>}'


def record_run_failure(output_dir: str | Path, exc: Exception) -> None:
    """Record a run's own error in FAILED_FILE (atomically), for its caller to raise."""
    atomic_write_json(Path(output_dir) / FAILED_FILE, {"error": str(exc),
                                                       "type": type(exc).__name__})


def clear_run_failure(output_dir: str | Path) -> None:
    """Drop the record: a run starting, or a retry that another try cures."""
    (Path(output_dir) / FAILED_FILE).unlink(missing_ok=True)


def read_run_failure(output_dir: str | Path) -> str | None:
    """The error the run recorded, None when it recorded none; a record that cannot be read is
    that error too, naming the file (delete it to train the run again)."""
    path = Path(output_dir) / FAILED_FILE
    if not path.is_file():
        return None
    try:
        error = json.loads(path.read_text())["error"]
    except OSError as exc:
        return _damaged(path, exc.strerror or exc.__class__.__name__)
    except (ValueError, TypeError, KeyError):  # ValueError: also UnicodeDecodeError
        return _damaged(path, "not the JSON its writer writes")
    return error if isinstance(error, str) else _damaged(path, "its 'error' is not text")


def _damaged(path: Path, why: str) -> str:
    return (f"{path}: a damaged failure record ({why}); expected {RECORD_EXPECTED}: the run "
            "failed, or the file was changed; delete it to train the run again")


def raise_if_run_failed(output_dir: str | Path) -> None:
    """Raise the error a run recorded in FAILED_FILE (one line), if any."""
    error = read_run_failure(output_dir)
    if error is not None:
        raise RunFailed(error)
