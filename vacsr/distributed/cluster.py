"""Connecting to Ray: the cluster named by RAY_ADDRESS (`ray job submit` sets it) or --ray-address,
else a local instance of our own (never one that `ray start` left running on this machine)."""
from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import tempfile
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

import ray

from vacsr.distributed.leftovers import (
    new_temp_dir,
    reap_dead_instances,
    record_instance,
    remove_temp_dir,
)
from vacsr.stop import Stopped

# Loggers whose INFO output (Tune's tables and hints, Train's per-report lines, Optuna's study
# notices) belongs in the log files, not on the researcher's console.
CHATTY_LOGGERS = ("ray", "ray.tune", "ray.train", "ray.data", "optuna", "mlflow", "alembic")
# a local instance of our own listens on loopback only: the token-auth notice asks nothing of
# the user there
NOTICE_LOGGERS = ("ray._private.authentication.authentication_token_setup",)


def quiet_logging(verbose: bool = False) -> None:
    """Warnings and errors only on the console, unless `verbose`."""
    level = logging.INFO if verbose else logging.WARNING
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    for name in NOTICE_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.ERROR)
    if not verbose:
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no TensorBoard hints
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        # Tune saves its experiment state whenever a trial has written `num_to_keep` checkpoints
        # since the last save, so that the state never names a deleted checkpoint (--resume
        # restores from it); with a checkpoint per epoch that is often, and each time Tune warns
        # that it may be a bottleneck. The saves stay; the warning goes
        os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
        warnings.filterwarnings("ignore", module="ray")
        try:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
        except ImportError:
            pass


def ensure_ray(num_cpus: int | None = None, num_gpus: int | None = None,
               include_dashboard: bool = False, address: str | None = None,
               log_to_driver: bool = True) -> None:
    """ray.init once. With `address` (or RAY_ADDRESS) join that cluster; otherwise start a local
    instance of our own (`address="local"`: a cluster recorded by `ray start` is not joined) with
    explicit resources, and the dashboard on loopback only if asked: Tune and Train run without
    it, and its processes cost a one-dataset sweep 6 to 10 of its 30 CPU-s (docs/performance.md)."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = address or os.environ.get("RAY_ADDRESS")
    quiet = {} if log_to_driver else {"logging_level": logging.WARNING}
    if address:
        _init_keeping_stop_handler(address=address, log_to_driver=log_to_driver, **quiet)
        return
    # one machine is never preempted: skip Ray Train's per-run preemption-watcher actor
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    reap_dead_instances()  # what a SIGKILLed driver's own instance left (distributed/leftovers.py)
    temp = _local_temp_dir()
    with _temp_dir_of_children(temp):
        context = _init_keeping_stop_handler(
            address="local", num_cpus=num_cpus or os.cpu_count() or 1, num_gpus=num_gpus,
            include_dashboard=include_dashboard, dashboard_host="127.0.0.1",
            log_to_driver=log_to_driver, **quiet)
    record_instance(context.address_info["session_dir"], temp)


# The temporary folder of the local instance's processes. Ray ends them without their exit
# handlers, so what they make in TMPDIR stays: the dashboard starts its modules through
# multiprocessing's forkserver, whose listener folder (`pymp-*`) only a clean exit removes. They
# get a folder of their own, removed once the instance has ended.
_TEMP_DIRS: list[Path] = []


def _local_temp_dir() -> Path:
    """A new folder for the instance about to start. An earlier instance has ended (Ray is not
    initialised): its folder goes now."""
    _remove_temp_dirs()
    _TEMP_DIRS.append(new_temp_dir())
    return _TEMP_DIRS[-1]


def _remove_temp_dirs() -> None:
    while _TEMP_DIRS:
        remove_temp_dir(_TEMP_DIRS.pop())


@atexit.register  # after `import ray`, so before Ray's own exit handler (the later runs first)
def _end_local_instance() -> None:
    if _TEMP_DIRS:
        ray.shutdown()
        _remove_temp_dirs()


@contextmanager
def _temp_dir_of_children(folder: Path):
    """TMPDIR is `folder` for the processes ray.init starts (and theirs); this process keeps its
    own, and Ray's session folder stays where Ray puts it (RAY_TMPDIR, else TMPDIR on Linux,
    else /tmp)."""
    tempfile.gettempdir()  # this process's choice, cached by tempfile before TMPDIR changes
    saved = {name: os.environ.get(name) for name in ("TMPDIR", "RAY_TMPDIR")}
    linux = sys.platform.startswith("linux")
    os.environ.setdefault("RAY_TMPDIR", (saved["TMPDIR"] if linux else None) or "/tmp")
    os.environ["TMPDIR"] = str(folder)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _init_keeping_stop_handler(**kwargs):
    """ray.init, and after it the SIGTERM handler the caller had set (the sweep driver's, `vacsr
    train`'s): ray.init sets one of its own first thing, which ends the process with status 15
    and no word, during the start and for good after it. A SIGTERM that Ray's handler caught while
    starting becomes Stopped, once what had started is shut down. A process without a handler of
    its own keeps Ray's (its exit runs Ray's shutdown)."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    ours = callable(previous)
    try:
        return ray.init(**kwargs)
    except SystemExit as exc:
        if not ours or exc.code != signal.SIGTERM:
            raise
        ray.shutdown()
        raise Stopped(signal.SIGTERM) from None
    finally:
        if ours:
            signal.signal(signal.SIGTERM, previous)
