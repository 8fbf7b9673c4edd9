"""check_tracking_uri against local HTTP servers: only an MLflow tracking server passes."""
from __future__ import annotations

import functools
import http.server
import json
import socket

import pytest

from tests.support.servers import answering, http_serving, responding

pytest.importorskip("mlflow")

from vacsr.errors import ConfigError  # noqa: E402
from vacsr.records import check_tracking_uri  # noqa: E402
from vacsr.records.uri import MLFLOW_PROBE_PATH  # noqa: E402


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


# what `mlflow server` answers when the asked experiment does not exist
NO_EXPERIMENT = json.dumps({"error_code": "RESOURCE_DOES_NOT_EXIST",
                            "message": "Could not find experiment with name 'Default'"}).encode()


def _error(uri: str) -> str:
    with pytest.raises(ConfigError) as info:
        check_tracking_uri(uri, timeout_s=2.0)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_plain_web_server_is_refused_naming_the_uri(tmp_path):
    (tmp_path / "index.html").write_text("<html><body>not mlflow</body></html>")
    with http_serving(functools.partial(_Quiet, directory=str(tmp_path))) as uri:
        message = _error(uri)
    assert message.startswith(f"MLflow tracking URI {uri}: answered, but not as an MLflow "
                              "tracking server (HTTP 404, text/html)")
    assert message.endswith("expected an MLflow server (mlflow server / mlflow ui)")


def test_html_200_is_refused_and_the_password_hidden():
    with http_serving(answering(200, "text/html; charset=utf-8", b"<html>hi</html>")) as uri:
        message = _error(uri.replace("//", "//user:secret@"))
    assert "(HTTP 200, text/html)" in message
    assert "secret" not in message and "user:***@" in message


def test_mlflow_like_server_passes_with_credentials_and_a_path_prefix():
    paths = []
    with http_serving(responding(lambda request: paths.append(request.path)
                                 or (404, NO_EXPERIMENT))) as uri:
        check_tracking_uri(uri.replace("//", "//user:pw@") + "/", timeout_s=2.0)
        check_tracking_uri(uri + "/mlflow", timeout_s=2.0)
    assert paths == [f"{MLFLOW_PROBE_PATH}?experiment_name=Default",
                     f"/mlflow{MLFLOW_PROBE_PATH}?experiment_name=Default"]


def test_refused_credentials_and_server_errors_fail(monkeypatch):
    for name in ("MLFLOW_TRACKING_AUTH", "MLFLOW_TRACKING_AWS_SIGV4"):
        monkeypatch.delenv(name, raising=False)
    with http_serving(answering(401, "text/plain", b"You are not authenticated")) as uri:
        message = _error(uri.replace("//", "//user:secret@"))
    assert message.startswith(f"MLflow tracking URI {uri.replace('//', '//user:***@')}: the "
                              "server refused the credentials (HTTP 401; sent user 'user' and a "
                              "password)")
    assert "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD" in message
    assert "MLFLOW_TRACKING_TOKEN" in message and "secret" not in message
    with http_serving(answering(403, "text/plain", b"Forbidden")) as uri:
        monkeypatch.setenv("MLFLOW_TRACKING_AUTH", "some-plugin")
        check_tracking_uri(uri, timeout_s=2.0)  # a plugin authenticates: MLflow reports it
    with http_serving(answering(503, "text/plain", b"--artifacts-only")) as uri:
        assert _error(uri).endswith(": server answered HTTP 503")
    body = json.dumps({"error_code": "INTERNAL_ERROR", "message": "database is locked"}).encode()
    with http_serving(answering(500, "application/json", body)) as uri:
        assert _error(uri).endswith(": server answered HTTP 500: database is locked")


def test_closed_port_is_notanswering():
    with socket.socket() as sock:  # a port that was free a moment ago, now closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    message = _error(f"http://127.0.0.1:{port}")
    assert message.startswith(f"MLflow tracking URI http://127.0.0.1:{port}: server not answering "
                              "within 2 s")


@pytest.mark.parametrize("uri, shown", [
    ("http://user:pw0rd@host:5000/p", "http://user:***@host:5000/p"),
    ("http://user:@host", "http://user:***@host"),
    ("http://UserT0k444@host:5000", "http://***@host:5000"),
    ("https://host/?token=QueryT0k333", "https://host/?token=***"),
    ("https://host/mlflow?access_token=a1&view=x&api_key=k2",
     "https://host/mlflow?access_token=***&view=x&api_key=***"),
    ("https://bucket.host/o?X-Amz-Credential=AKIA9%2F&X-Amz-Signature=f00d&X-Amz-Expires=60",
     "https://bucket.host/o?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Expires=60"),
    ("postgresql://vacsr:dbPw9@db:5432/runs?password=dbPw9&sslmode=require",
     "postgresql://vacsr:***@db:5432/runs?password=***&sslmode=require"),
    ("http://u:p4ss@host:notaport/?secret=s3", "http://u:***@host:notaport/?secret=***"),
    ("http://u:p4ss@[::1/?secret=s3", "http://***@[::1/?secret=***"),  # urllib cannot split it
    ("sqlite:////data/runs/mlflow.db", "sqlite:////data/runs/mlflow.db"),
    ("http://127.0.0.1:5000/?experiment=1", "http://127.0.0.1:5000/?experiment=1"),
    ("https://acct.blob.core/c?sv=2024&sig=Zz9%3D", "https://acct.blob.core/c?sv=2024&sig=***"),
    ("https://gcs/b/o?X-Goog-Signature=ab12&X-Goog-Date=1",
     "https://gcs/b/o?X-Goog-Signature=***&X-Goog-Date=1"),
    ("http://h/?apikey=K1&access%5Ftoken=T1", "http://h/?apikey=***&access%5Ftoken=***"),
    ("http://host:5000/#access_token=Fr4gT0k&token_type=bearer",  # OAuth implicit grant
     "http://host:5000/#access_token=***&token_type=***"),
    ("https://host/?view=x#/runs?api_key=k9&page=2",
     "https://host/?view=x#/runs?api_key=***&page=2"),
    ("http://127.0.0.1:5000/#/experiments/1", "http://127.0.0.1:5000/#/experiments/1"),
    ("http://u:p4ss@[::1/#access_token=zz", "http://***@[::1/#access_token=***"),
    ("s3://AKIA1:wJalr%2Fk@bucket/x", "s3://AKIA1:***@bucket/x"),
    ("s3://bucket/x?region=eu&secret_access_key=wJalr",
     "s3://bucket/x?region=eu&secret_access_key=***"),
])
def test_every_credential_form_of_a_uri_is_masked(uri, shown):
    from vacsr.redact import redact_uri

    assert redact_uri(uri) == shown


def test_a_message_quoting_a_uri_or_its_secrets_is_masked():
    """A library's error may quote the URI, or a secret alone, decoded."""
    from vacsr.redact import redact_text

    uri = "s3://AKIA1:wJalr%2Fk@bucket/x?region=eu&session_token=T0k#access_token=F4"
    message = f"cannot open {uri}: bad key wJalr/k (token T0k, F4)"
    assert redact_text(message, uri) == ("cannot open s3://AKIA1:***@bucket/x?region=eu&"
                                         "session_token=***#access_token=***: bad key *** "
                                         "(token ***, ***)")


@pytest.mark.parametrize("secret, carrying", [
    ("QueryT0k333", lambda url, secret: f"{url}/?token={secret}"),
    ("UserT0k444", lambda url, secret: url.replace("//", f"//{secret}@")),  # a token as user
])
def test_refused_credentials_line_hides_a_token_in_the_query_or_the_user(monkeypatch, secret,
                                                                         carrying):
    for name in ("MLFLOW_TRACKING_AUTH", "MLFLOW_TRACKING_AWS_SIGV4"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "envPw")  # the URI's user name gets sent
    with http_serving(answering(401, "text/plain", b"You are not authenticated")) as uri:
        message = _error(carrying(uri, secret))
    assert "the server refused the credentials (HTTP 401" in message
    assert secret not in message and "***" in message and "envPw" not in message


def test_a_postgresql_url_as_users_write_it_gets_the_installed_driver_and_keeps_its_login():
    """SQLAlchemy's default driver for `postgresql://` is psycopg2; the cluster extra installs
    psycopg 3: a URL naming no driver gets it, `postgres://` too, and nothing else changes."""
    from importlib.util import find_spec

    from vacsr.records.client import client_uri
    from vacsr.records.database_url import with_driver

    assert find_spec("psycopg") is not None and find_spec("psycopg2") is None
    login = "user:p%40ss@db.example:5432/mlflow?sslmode=require"
    assert with_driver(f"postgresql://{login}") == f"postgresql+psycopg://{login}"
    assert with_driver(f"postgres://{login}") == f"postgresql+psycopg://{login}"
    assert client_uri(f"postgresql://{login}") == f"postgresql+psycopg://{login}"
    for kept in (f"postgresql+psycopg2://{login}", f"mysql+pymysql://{login}",
                 "sqlite:////tmp/m.db", "http://127.0.0.1:5000"):
        assert with_driver(kept) == kept
