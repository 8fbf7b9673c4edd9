"""How MLflow's client behaves in vacsr's processes: set before each tracker opens its client.

MLflow retries a request that got no answer 7 times, each wait twice the last (urllib3 retries the
first at once, then waits 4, 8, ... 128 s): a tracking server that died mid-sweep was said only
after about 250 s. The sweep (or run) then stops and `--resume` continues, so waiting longer buys
nothing: 4 retries bound it to about 30 s (0 + 4 + 8 + 16 s and a second of jitter each). The
variables win where set (a server that rate-limits for minutes may want more).

The notes MLflow and alembic log at INFO while they create or migrate a store (`Creating initial
MLflow database tables...`) reached the console of every tracked `vacsr train`; they go quiet.
"""
from __future__ import annotations

import logging
import os

HTTP_RETRY_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "4",
                       "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2"}
STORE_NOTE_LOGGERS = ("mlflow.store.db.utils", "alembic.runtime.migration")


def apply_client_settings() -> None:
    """The bounded retries (unless set) and quiet store notes, for this process."""
    for name, value in HTTP_RETRY_DEFAULTS.items():
        os.environ.setdefault(name, value)
    for name in STORE_NOTE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
