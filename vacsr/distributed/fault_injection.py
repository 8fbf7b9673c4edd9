"""Fault injection for the resilience tests: VACSR_FAIL_ONCE=<epoch>:<marker file> on the driver
kills the process that trains the last rank of a run as it starts that (0-based) epoch, once (the
marker records it): a Ray Train worker (vacsr/distributed/worker.py) or an actor that trains a
run itself (vacsr/distributed/actor_run.py). Read on the driver and sent with the run, since Ray's
processes need not see the driver's environment."""
from __future__ import annotations

import os
import time
from pathlib import Path

FAIL_ONCE_VARIABLE = "VACSR_FAIL_ONCE"


def fail_once_spec() -> str | None:
    """The driver's VACSR_FAIL_ONCE, to send with a run."""
    return os.environ.get(FAIL_ONCE_VARIABLE)


def maybe_fail_once(spec: str | None, epoch: int, rank: int = 0, world: int = 1,
                    wait_s: float = 0.0) -> None:
    """Exit this process abruptly (not a Python exception) as `epoch` starts on the last rank,
    once; `wait_s` first (a Train controller collects the last report by polling)."""
    if not spec or rank != world - 1:
        return
    fail_epoch, marker = spec.split(":", 1)
    if epoch == int(fail_epoch) and not Path(marker).exists():
        Path(marker).write_text(f"killed at the start of epoch {epoch + 1}\n")
        time.sleep(wait_s)
        os._exit(1)
