"""SIGTERM, SIGINT and SIGHUP as one exception, so that a stopped `vacsr train` closes what it
opened (its MLflow run as KILLED) and exits 128 + the signal's number with one line. SIGHUP is a
closed terminal or a dropped ssh session: a stop like SIGTERM, not a crash that leaves runs
RUNNING. Where Python waits inside a library's C++ (Ray's), a handler that raises would surface
as a SystemError: there the signal is noted (`SignalNote`) and raised by the waiting loop (the
sweep driver, `--plan`'s calibration)."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_held = 0  # depth of signals_held() blocks in the main thread, where Python runs handlers
_pending: int | None = None  # a stop signal that arrived inside such a block


class Stopped(KeyboardInterrupt):
    """A signal asked the process to stop; a KeyboardInterrupt, so every `except
    KeyboardInterrupt` that closes a run as KILLED treats SIGTERM like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block SIGTERM / SIGINT / SIGHUP raise Stopped in the main thread; a second
    signal while the first is being handled (runs closing) is ignored."""
    def stop(signum, frame) -> None:
        global _pending
        for other in SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        if _held:
            _pending = signum  # raised once the write in progress has ended (signals_held)
            return
        raise Stopped(signum)

    global _pending
    _pending = None
    previous = {s: signal.signal(s, stop) for s in SIGNALS}
    try:
        yield
    finally:
        _pending = None
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def signals_held() -> Iterator[None]:
    """Within the block a stop signal is noted, and Stopped raised as the block ends. For writes
    to a record store: Stopped raised inside an SQLite transaction leaves it open, holding the
    database's lock, and the run's own closing write (KILLED) then waits for it in vain."""
    global _held, _pending
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers run in the main thread: a stop never interrupts this thread's write
        return
    _held += 1
    try:
        yield
    finally:
        _held -= 1
    if not _held and _pending is not None:  # the block ended normally: stop now
        signum, _pending = _pending, None
        raise Stopped(signum)


class SignalNote:
    """SIGTERM / SIGINT / SIGHUP noted by the handler (installed on creation, in the main
    thread) and raised as Stopped by `check()`, which a loop waiting on other code calls."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous = {s: signal.signal(s, self._note) for s in SIGNALS}

    def _note(self, signum, frame) -> None:
        self.signum = signum

    def check(self) -> None:
        if self.signum is not None:
            raise Stopped(self.signum)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
