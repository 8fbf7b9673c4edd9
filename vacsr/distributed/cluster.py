"""Connecting to Ray: the cluster named by RAY_ADDRESS (`ray job submit` sets it) or --ray-address,
else a local instance of our own (never one that `ray start` left running on this machine)."""
from __future__ import annotations

import logging
import os
import signal
import threading
import warnings

import ray

from vacsr.distributed.leftovers import reap_dead_instances, record_instance
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
               include_dashboard: bool = True, address: str | None = None,
               log_to_driver: bool = True) -> None:
    """ray.init once. With `address` (or RAY_ADDRESS) join that cluster; otherwise start a local
    instance of our own (`address="local"`: a cluster recorded by `ray start` is not joined) with
    explicit resources and the dashboard on loopback (Train/Tune use its state API)."""
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
    context = _init_keeping_stop_handler(
        address="local", num_cpus=num_cpus or os.cpu_count() or 1, num_gpus=num_gpus,
        include_dashboard=include_dashboard, dashboard_host="127.0.0.1",
        log_to_driver=log_to_driver, **quiet)
    record_instance(context.address_info["session_dir"])


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
