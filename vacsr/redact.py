"""Secrets out of what vacsr prints and writes: a URI's password becomes `***`.

The config holds the URI as given (a run needs it); every copy that leaves the process (console
lines, log records, MLflow params and artifacts, config.yaml, checkpoints, state files) is the
redacted form, and MLflow gets the credentials through its own environment variables
(vacsr/records/tracker.py).
"""
from __future__ import annotations

import urllib.parse


def redact_uri(uri: str) -> str:
    """The URI with its password replaced by `***` (unchanged when it has none)."""
    try:
        parts = urllib.parse.urlsplit(uri)
        password = parts.password
    except ValueError:  # not a URI urllib can split (e.g. a bad port): hide all user info
        head, sep, tail = uri.rpartition("@")
        return f"{head.split('://')[0]}://***@{tail}" if sep and "://" in head else uri
    if password is None:
        return uri
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def split_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """(the URI without `user:password@`, user, password); user and password are None (and the
    URI unchanged) when it carries none."""
    try:
        parts = urllib.parse.urlsplit(uri)
        user, password = parts.username, parts.password
    except ValueError:
        return uri, None, None
    if user is None and password is None:
        return uri, None, None
    bare = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))
    unquote = urllib.parse.unquote
    return bare, unquote(user) if user else None, unquote(password) if password else None
