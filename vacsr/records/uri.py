"""Tracking URIs: pick the store and fail fast before any training starts.

The default store is SQLite next to the runs, always as an absolute path because Ray trials change
their working directory. `check_tracking_uri` turns an unreachable or wrong store into one
ConfigError line naming the URI: MLflow itself retries an absent server for minutes and then fails
deep inside a worker; a server that refuses the credentials is said so in one line, naming the
variables MLflow reads them from. `check_store_exists` is for commands that only read a store:
MLflow would create an empty one at a mistyped path. `store_creation_lock` keeps two processes
from creating one SQLite store at once.
"""
from __future__ import annotations

import base64
import configparser
import contextlib
import fcntl
import http.client
import json
import os
import re
import socket
import sqlite3
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from vacsr.errors import ConfigError
from vacsr.paths import absolute_path
from vacsr.redact import redact_uri, split_credentials  # one redaction, also for error lines

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
DB_NAME = "mlflow.db"
DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
# Any MLflow tracking server serves this endpoint and answers it in JSON, even with an error body
# (RESOURCE_DOES_NOT_EXIST) when the experiment is missing.
MLFLOW_PROBE_PATH = "/api/2.0/mlflow/experiments/get-by-name"
_PROBE_QUERY = "experiment_name=Default"
_MAX_PROBE_BYTES = 1 << 16
# what MLflow answers the probe with: the experiment, or its error (RESOURCE_DOES_NOT_EXIST)
_MLFLOW_ANSWER_KEYS = {"experiment", "error_code"}
# the variables MLflow's client reads its credentials from (mlflow.utils.credentials), and those
# that hand authentication to a plugin the probe cannot imitate
USER_ENV, PASSWORD_ENV, TOKEN_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                                     "MLFLOW_TRACKING_TOKEN")
PLUGIN_AUTH_ENVS = ("MLFLOW_TRACKING_AUTH", "MLFLOW_TRACKING_AWS_SIGV4")
# how long opening a store waits for another process that is creating it (store_creation_lock)
STORE_CREATION_WAIT_S = 120.0


def _scheme(uri: str) -> str | None:
    """Lower-case URI scheme, or None for a bare path (a one-letter "scheme" is a drive letter)."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.\-]*):", uri)
    return match.group(1).lower() if match and len(match.group(1)) > 1 else None


_SQLITE = re.compile(r"^(sqlite(?:\+\w+)?:///)([^?]*)(\?.*)?$", re.IGNORECASE)


def sqlite_path(uri: str) -> Path | None:
    """The database file of an `sqlite:///...` URI; None for in-memory and non-SQLite URIs."""
    match = _SQLITE.match(uri)
    if not match or match.group(2) in ("", ":memory:"):
        return None
    return Path(urllib.parse.unquote(match.group(2)))


def _absolute_sqlite(uri: str) -> str:
    match, path = _SQLITE.match(uri), sqlite_path(uri)
    if match is None or path is None or (path.is_absolute() and not str(path).startswith("~")):
        return uri
    # "sqlite:///" + "/abs/path" is SQLAlchemy's spelling of an absolute path.
    return f"{match.group(1)}{absolute_path(path)}{match.group(3) or ''}"


def _absolute_file(uri: str) -> str:
    parts = urllib.parse.urlsplit(uri)
    if parts.netloc not in ("", "localhost") or parts.path.startswith("/"):
        return uri
    return absolute_path(urllib.parse.unquote(parts.path)).as_uri()


def resolve_tracking_uri(uri: str | None = None, default_dir: str | Path = ".") -> str:
    """The tracking URI to use, with every local path made absolute.

    Order: `uri`, else env MLFLOW_TRACKING_URI, else `sqlite:///<abs default_dir>/mlflow.db`.
    A bare path names the folder that holds `mlflow.db` (or the database itself if it ends in .db).
    """
    chosen = (uri or os.environ.get(TRACKING_URI_ENV) or "").strip()
    if not chosen:
        return f"sqlite:///{absolute_path(default_dir) / DB_NAME}"
    scheme = _scheme(chosen)
    if scheme is None:
        path = absolute_path(chosen)
        return f"sqlite:///{path if path.suffix == '.db' else path / DB_NAME}"
    if scheme.startswith("sqlite"):
        return _absolute_sqlite(chosen)
    if scheme == "file":
        return _absolute_file(chosen)
    return chosen


def _unreachable(uri: str, reason: Any) -> ConfigError:
    reason = " ".join(str(reason).split())  # one line, whatever the OS error text holds
    return ConfigError(f"MLflow tracking URI {redact_uri(uri)}: {reason}")


def check_tracking_uri(uri: str | None, timeout_s: float = 5.0) -> None:
    """Raise ConfigError naming the URI unless its store can be reached and written.

    Call before training or trials start. Creates the folder of an SQLite database (SQLite will
    not).
    """
    resolved = resolve_tracking_uri(uri)
    shown = uri or resolved
    scheme = _scheme(resolved) or ""
    if scheme in ("http", "https"):
        _check_http(shown, resolved, timeout_s)
    elif scheme.startswith("sqlite"):
        _check_sqlite(shown, resolved, timeout_s)
    elif scheme == "file":
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
            raise _unreachable(shown, "the file store is refused by MLflow >= 3.13 (use sqlite:///"
                                      "<folder>/mlflow.db or set MLFLOW_ALLOW_FILE_STORE=true)")
        _check_folder(shown, absolute_path(urllib.parse.urlsplit(resolved).path))
    elif scheme.split("+")[0] in DB_PORTS:
        _check_tcp(shown, resolved, timeout_s)
    else:
        raise _unreachable(shown, f"unsupported scheme {scheme!r} (use sqlite, http(s), "
                                  "postgresql, mysql or mssql)")


def _check_http(shown: str, uri: str, timeout_s: float) -> None:
    """Ask an MLflow REST endpoint: any web server answers something, but only MLflow answers it
    in JSON, so a wrong port (a notebook, a static file server) fails here and not at the first
    logged metric with an HTML page in the error."""
    parts = urllib.parse.urlsplit(uri)  # urllib cannot parse user:password@ hosts: drop them
    probe = parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1], query=_PROBE_QUERY,
                           path=parts.path.rstrip("/") + MLFLOW_PROBE_PATH, fragment="")
    authorization, sent = _credentials(uri)
    try:
        status, kind, body = _http_get(urllib.parse.urlunsplit(probe), timeout_s, authorization)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _unreachable(shown, f"server not answering within {timeout_s:g} s "
                                  f"({getattr(exc, 'reason', exc)})") from None
    except http.client.HTTPException as exc:  # something answered, but not in HTTP
        raise _unreachable(shown, f"answered, but not in HTTP ({exc.__class__.__name__}); "
                                  "expected an MLflow server (mlflow server / mlflow ui)") from None
    if status in (401, 403):
        if any(os.environ.get(name) for name in PLUGIN_AUTH_ENVS):
            return  # a plugin authenticates MLflow's requests, not these: MLflow reports it
        raise _unreachable(shown, f"the server refused the credentials (HTTP {status}; sent "
                                  f"{sent}); MLflow takes them from the URI's user:password, "
                                  f"else {USER_ENV} / {PASSWORD_ENV}, else {TOKEN_ENV}")
    answer = _json_object(body)
    if status >= 500:
        detail = f": {str(answer.get('message', ''))[:200]}" if answer else ""
        raise _unreachable(shown, f"server answered HTTP {status}{detail}")
    if answer is None or not _MLFLOW_ANSWER_KEYS & set(answer):
        what = kind if answer is None else "JSON without an 'experiment' or 'error_code'"
        raise _unreachable(shown, f"answered, but not as an MLflow tracking server (HTTP {status}, "
                                  f"{what}); expected an MLflow server (mlflow server / mlflow ui)")


def _mlflow_file_credentials() -> tuple[str | None, str | None]:
    """User and password of ~/.mlflow/credentials, which MLflow reads after its variables."""
    parser = configparser.ConfigParser()
    try:
        parser.read(os.path.expanduser("~/.mlflow/credentials"))
    except (configparser.Error, ValueError):  # not an INI file, not text
        return None, None
    section = parser["mlflow"] if parser.has_section("mlflow") else {}
    return section.get(USER_ENV.lower()), section.get(PASSWORD_ENV.lower())


def _credentials(uri: str) -> tuple[str | None, str]:
    """(the Authorization header MLflow's client would send to `uri`, what it holds in words):
    user:password of the URI (vacsr hands them to MLflow's variables), else of MLflow's
    variables or credentials file, else the token variable (mlflow.utils.rest_utils)."""
    _, uri_user, password = split_credentials(uri)
    from_file = _mlflow_file_credentials()
    user = uri_user or os.environ.get(USER_ENV) or from_file[0]
    # a user name the URI gives without a password may be a token (redact_uri hides it too)
    named = "the URI's user name" if uri_user and not password else f"user {user!r}"
    password = password or os.environ.get(PASSWORD_ENV) or from_file[1]
    if user and password:
        basic = base64.standard_b64encode(f"{user}:{password}".encode()).decode()
        return f"Basic {basic}", f"{named} and a password"
    if os.environ.get(TOKEN_ENV):
        return f"Bearer {os.environ[TOKEN_ENV]}", f"the token in {TOKEN_ENV}"
    return None, "no credentials"


def _http_get(url: str, timeout_s: float, authorization: str | None = None
              ) -> tuple[int, str, bytes]:
    """(status, media type, start of the body) of a GET; an error status still has a body."""
    request = urllib.request.Request(url)
    if authorization is not None:
        request.add_unredirected_header("Authorization", authorization)  # not to another host
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        response = exc
    with response:
        kind = (response.headers.get("Content-Type") or "").split(";")[0].strip()
        return response.getcode(), kind or "no content type", response.read(_MAX_PROBE_BYTES)


def _json_object(body: bytes) -> dict | None:
    try:
        answer = json.loads(body)
    except ValueError:  # also UnicodeDecodeError
        return None
    return answer if isinstance(answer, dict) else None


def _check_folder(shown: str, folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # a real write: os.access lies for root
            pass
    except OSError as exc:
        raise _unreachable(shown, f"folder {folder} is not writable "
                                  f"({exc.strerror or exc.__class__.__name__})") from None


def _check_sqlite(shown: str, uri: str, timeout_s: float) -> None:
    path = sqlite_path(uri)
    if path is None:  # in-memory database: nothing on disk to check
        return
    _check_folder(shown, absolute_path(path).parent)
    if not path.exists():
        return
    # mode=rw opens an existing file, never creates one, and quietly falls back to read-only
    # when the file cannot be written: only a write tells, so write one and roll it back
    try:
        conn = sqlite3.connect(f"file:{urllib.parse.quote(str(absolute_path(path)))}?mode=rw",
                               uri=True, timeout=timeout_s, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("CREATE TABLE vacsr_write_check (x INTEGER)")
            conn.execute("ROLLBACK")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise _unreachable(shown, f"{path} is not a writable SQLite database ({exc})") from None


def _check_tcp(shown: str, uri: str, timeout_s: float) -> None:
    parts = urllib.parse.urlsplit(uri)
    if not parts.hostname:  # a local socket given in the query: let the driver report it
        return
    port = parts.port or DB_PORTS[_scheme(uri).split("+")[0]]
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        raise _unreachable(shown, f"database server {parts.hostname}:{port} not answering "
                                  f"({exc.strerror or exc})") from None


# ---------------------------------------------------------------- stores that must exist already
def check_store_exists(uri: str | None, expected: str) -> str:
    """The resolved URI, once its store is known to exist already: for commands that only read a
    store (`vacsr best`), where MLflow would quietly create an empty one (and its folder) at a
    mistyped path. A server (http, databases) is asked by check_tracking_uri instead."""
    resolved = resolve_tracking_uri(uri)
    shown, scheme = uri or resolved, _scheme(resolved) or ""
    if scheme.startswith("sqlite") and (path := sqlite_path(resolved)) is not None:
        _check_sqlite_store(shown, absolute_path(path), expected)
    elif scheme == "file":
        folder = absolute_path(urllib.parse.unquote(urllib.parse.urlsplit(resolved).path))
        if not folder.is_dir():
            raise _unreachable(shown, f"no MLflow store at {folder} (no such folder); expected "
                                      f"{expected}")
    return resolved


def _check_sqlite_store(shown: str, path: Path, expected: str) -> None:
    if not path.is_file():
        what = "no such file" if not path.exists() else "not a file"
        raise _unreachable(shown, f"no MLflow store at {path} ({what}); expected {expected}")
    try:  # read-only: a file that is no store stays as it is
        conn = sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise _unreachable(shown, f"{path} is not an SQLite database ({exc}); expected "
                                  f"{expected}") from None
    if not {"experiments", "runs"} <= tables:
        raise _unreachable(shown, f"{path} holds no MLflow store (no experiments or runs table); "
                                  f"expected {expected}")


# ---------------------------------------------------------------- creating a store
@contextlib.contextmanager
def store_creation_lock(uri: str, timeout_s: float = STORE_CREATION_WAIT_S):
    """Held while MLflow (or Optuna) opens the store of `uri`, which creates and migrates a new
    SQLite store: two processes doing that at once break each other's migration (`table
    _alembic_tmp_... already exists`). An flock on the database's folder, so nothing is written
    beside it; other stores, and file systems without flock on folders, pass through."""
    path = sqlite_path(uri)
    try:
        fd = os.open(absolute_path(path).parent, os.O_RDONLY | os.O_DIRECTORY) if path else None
    except OSError:  # no folder yet: SQLite reports that itself
        fd = None
    try:
        if fd is not None:
            _wait_for_lock(fd, f"store {path}", timeout_s)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # drops the lock


def _wait_for_lock(fd: int, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise ConfigError(f"{what}: another process has been creating it for "
                                  f"{timeout_s:g} s; try again once it is done") from None
            time.sleep(0.05)
        except OSError:  # flock not supported here: go on unguarded
            return
