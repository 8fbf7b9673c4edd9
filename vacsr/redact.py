"""Secrets out of what vacsr prints and writes: every credential a URI can carry becomes `***`.

A URI carries credentials in its user info (`user:password@`, or a token alone as the user name,
as some proxies take it) and in query parameters whose names say so (`?token=`, `access_token`,
`X-Amz-Signature`, `api_key`, ...), also when they follow `#` (an OAuth implicit grant's
`#access_token=`). The config holds the URI as given (a run needs it); every copy
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
    if query != parts.query:
        redacted = redacted.replace(f"?{parts.query}", f"?{query}", 1)
    fragment = _redact_query_text(parts.fragment, whole=True)
    if fragment != parts.fragment:  # the fragment is all that follows the first "#"
        redacted = f"{redacted.partition('#')[0]}#{fragment}"
    return redacted


def redact_text(text: str, uri: str) -> str:
    """`text` (a message that may quote `uri` whole, or in parts as a library's error does) with
    the URI redacted and each secret it carries replaced by `***`."""
    masked = text.replace(uri, redact_uri(uri))
    for secret in sorted(_secrets(uri), key=len, reverse=True):
        masked = masked.replace(secret, MASK)
    return masked


def _secrets(uri: str) -> set[str]:
    """The values `redact_uri` masks in `uri`, as written and decoded."""
    _, sep, rest = uri.partition("://")
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0] if sep else ""
    userinfo, at, _ = authority.rpartition("@")
    user, colon, password = userinfo.partition(":")
    found = {password if colon else user} if at else set()
    for part in (uri.partition("?")[2].partition("#")[0], uri.partition("#")[2]):
        for field in part.replace("?", "&").split("&"):
            name, equals, value = field.partition("=")
            if equals and _SECRET_PARAM.search(urllib.parse.unquote_plus(name)):
                found.add(value)
    found |= {urllib.parse.unquote_plus(value) for value in found}
    return {value for value in found if value}


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


def _redact_query_text(text: str, whole: bool = False) -> str:
    """The query after the first "?" in `text` masked the same way, and its fragment (for a URI
    urllib could not split); `whole`: `text` is a fragment, each of its "?"-parts parameters."""
    if whole:
        return "?".join(_redact_query(part) for part in text.split("?"))
    head, _, fragment = text.partition("#")
    head, sep, query = head.partition("?")
    masked = f"{head}?{_redact_query(query)}" if sep else head
    return f"{masked}#{_redact_query_text(fragment, whole=True)}" if "#" in text else masked


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
