"""SIGTERM and SIGINT as one exception, so that a stopped `vacsr train` closes what it opened
(its MLflow run as KILLED) and exits 128 + the signal's number with one line."""
from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(KeyboardInterrupt):
    """A signal asked the process to stop; a KeyboardInterrupt, so every `except
    KeyboardInterrupt` that closes a run as KILLED treats SIGTERM like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block SIGTERM / SIGINT raise Stopped in the main thread; a second signal while
    the first is being handled (runs closing) is ignored."""
    def stop(signum, frame) -> None:
        for other in SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {s: signal.signal(s, stop) for s in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
