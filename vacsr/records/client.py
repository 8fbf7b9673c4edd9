"""How a tracker reaches MLflow's client: its credentials moved from the URI to MLflow's own
environment variables, each client call held past a stop signal, and made again when it lost a
race with another process's write of the same record (records/conflicts.py)."""
from __future__ import annotations

import functools
import os
from typing import Any

from mlflow import MlflowClient

from vacsr.records.conflicts import retry_conflicts
from vacsr.records.database_url import with_driver
from vacsr.redact import split_credentials
from vacsr.stop import signals_held

MLFLOW_USER_ENV, MLFLOW_PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"


HTTP_SCHEMES = ("http://", "https://")  # a tracking server, whose basic auth MLflow sends itself


def client_uri(uri: str) -> str:
    """The URI MLflow's client gets. A tracking server's (http, https) without `user:password@`,
    which MLflow would print in its "View run" lines; the credentials go to MLflow's own
    MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD variables of this process (Ray workers
    build their own tracker from the config, so they set theirs). A database URI
    (`postgresql+psycopg://user:password@host/mlflow`) is the database's login and stays whole:
    MLflow hands it to SQLAlchemy, and never prints it; a PostgreSQL URL that names no driver
    gets the installed one (records/database_url.py)."""
    if not uri.lower().startswith(HTTP_SCHEMES):
        return with_driver(uri)
    bare, user, password = split_credentials(uri)
    if user is not None:
        os.environ[MLFLOW_USER_ENV] = user
    if password is not None:
        os.environ[MLFLOW_PASSWORD_ENV] = password
    return bare


class HeldClient:
    """An MlflowClient whose calls each end before a stop signal (SIGTERM, Ctrl-C in `vacsr
    train`) is raised: a write cut off inside its SQLite transaction would keep the store locked
    and the run could not be closed as KILLED (vacsr.stop.signals_held). A call that broke a
    unique constraint because another process wrote the same record at that moment is made
    again (retry_conflicts), so no caller needs a retry of its own."""

    def __init__(self, client: MlflowClient) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._client, name)
        if not callable(value):
            return value

        @functools.wraps(value)
        def held(*args, **kwargs):
            with signals_held():
                return retry_conflicts(value, *args, **kwargs)
        return held
