"""What a failed write leaves in a Tune experiment folder, cleared before `--resume` restores it.

A full disk (or a quota) mid-trial leaves zero-byte files where Tune was writing: its restore
then stops on them for good (an empty `error.pkl` ends in `EOFError: Ran out of input` when the
results are read). Empty pickles and JSON files are never valid, so they are removed (Tune falls
back to `error.txt` for an error); and trials that errored on a storage error are resumed from
their checkpoints, since freeing space removes their cause (so are trials whose MLflow server
stopped answering, once it is back); other errors stay final: the same config and seed fail
again.
"""
from __future__ import annotations

from pathlib import Path

from vacsr.sweep.reserve import outage


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
    (they failed on storage or on the tracking server). A URI (s3://...) is left as it is: object stores write whole
    objects or none."""
    if "://" in folder or not Path(folder).is_dir():
        return False
    clear_empty_files(Path(folder))
    return failed_on_outage(Path(folder))
