"""Secrets out of what vacsr prints and writes: every credential a URI can carry becomes `***`.

A URI carries credentials in its user info (`user:password@`, or a token alone as the user name,
as some proxies take it) and in query parameters whose names say so (`?token=`, `access_token`,
`X-Amz-Signature`, `api_key`, ...). The config holds the URI as given (a run needs it); every copy
that leaves the process (console lines, log records, MLflow params and artifacts, config.yaml,
checkpoints, state files) is the redacted form, and MLflow gets user and password through its own
environment variables (vacsr/records/client.py).
"""
from __future__ import annotations

import re
import urllib.parse

MASK = "***"
# query parameter names that hold a secret: any name containing one of these words
_SECRET_PARAM = re.compile(r"token|key|secret|passw|pwd|signature|credential|auth|^sig$",
                           re.IGNORECASE)


def redact_uri(uri: str) -> str:
    """The URI with its password (or its user name when no password follows it) and the values of
    its secret-named query parameters replaced by `***`; unchanged when it carries none."""
    try:
        parts = urllib.parse.urlsplit(uri)
        user, password = parts.username, parts.password
    except ValueError:  # not a URI urllib can split (e.g. a bad port): hide all user info
        head, sep, tail = uri.rpartition("@")
        hidden = f"{head.split('://')[0]}://{MASK}@{tail}" if sep and "://" in head else uri
        return _redact_query_text(hidden)
    netloc = parts.netloc
    if password is not None:
        netloc = netloc.replace(f":{password}@", f":{MASK}@", 1)
    elif user is not None:  # a name without a password may be a token: hide it all
        netloc = f"{MASK}@{netloc.rsplit('@', 1)[-1]}"
    # in place, not through urlunsplit, which rewrites some URIs (sqlite:////abs -> sqlite://abs)
    redacted = uri.replace(f"//{parts.netloc}", f"//{netloc}", 1) if netloc != parts.netloc else uri
    query = _redact_query(parts.query)
    return redacted.replace(f"?{parts.query}", f"?{query}", 1) if query != parts.query else redacted


def _redact_query(query: str) -> str:
    """`query` with the value of each secret-named parameter masked, the rest as written."""
    if not query:
        return query
    fields = []
    for field in query.split("&"):
        name, sep, _ = field.partition("=")
        secret = sep and _SECRET_PARAM.search(urllib.parse.unquote_plus(name))
        fields.append(f"{name}={MASK}" if secret else field)
    return "&".join(fields)


def _redact_query_text(text: str) -> str:
    """The query of a URI urllib could not split, masked the same way."""
    head, sep, query = text.partition("?")
    return f"{head}?{_redact_query(query)}" if sep else text


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
