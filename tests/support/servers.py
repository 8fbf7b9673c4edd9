"""Local servers and process sessions for tests: an http.server handler on a free loopback port,
a basic-auth proxy in front of `mlflow server`, free ports, and the server processes of one test
(the `servers` fixture in tests/conftest.py), each stopped with its whole session."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def http_serving(handler):
    """`handler` (an http.server handler class) on a free loopback port, in a thread, always
    shut down; yields the server's URL."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def responding(reply, content_type: str = "application/json"):
    """An http.server handler class answering every GET with what `reply(request)` returns:
    (HTTP status, body), `request` the handler (its path, its headers)."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            status, body = reply(self)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


def answering(status: int, content_type: str, body: bytes):
    """An http.server handler class answering every GET with `status` and `body`."""
    return responding(lambda request: (status, body), content_type)


def basic_auth_proxy(upstream: str, user: str, password: str, port: int = 0):
    """Basic auth in front of `mlflow server` at `upstream` (this venv has no mlflow[auth]), on
    loopback at `port` (a free one for 0): a request without user:password gets 401, so a run
    logs only if the credentials reach MLflow's requests. Returns (the server, its port); its
    `shutdown()` then `server_close()` leave the port refusing connections, as a dead server's."""
    import base64
    import http.server
    import threading
    import urllib.error
    import urllib.request

    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Proxy(http.server.BaseHTTPRequestHandler):
        def _forward(self) -> None:
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", "Basic")
                self.end_headers()
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("host", "authorization", "content-length")}
            request = urllib.request.Request(upstream + self.path, data=body or None,
                                             headers=headers, method=self.command)
            try:
                reply = urllib.request.urlopen(request, timeout=60)
            except urllib.error.HTTPError as exc:
                reply = exc
            with reply:
                payload = reply.read()
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


_PORTS_GIVEN: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that was free a moment ago, never one this process was given before:
    ports asked for in a row before anything listens on them (a Ray node's) stay distinct."""
    import socket

    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


class Servers:
    """The server processes of one test (`servers` fixture), each in a session of its own: at
    the end of the test each session is sent SIGTERM, and SIGKILL if it is still there a minute
    later."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list = []
        self.folders: list[Path] = []  # folders of their own, removed once they have stopped

    def start(self, command: list[str], port: int, *, log: Path, env: dict | None = None,
              cwd: Path | None = None, timeout: float = 200):
        """`command` (a server on 127.0.0.1:`port`) started in `cwd` (the test's folder unless
        given), its output appended to `log`; returns its process once its /health answers 200.
        Fails the test with the log's tail when it ends first or `timeout` seconds pass."""
        import subprocess
        import time
        import urllib.request

        with open(log, "a") as out:  # the server keeps its own copy of the descriptor
            process = subprocess.Popen(command, cwd=cwd or self.folder, env=env, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        self.started.append(process)
        deadline = time.time() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health",
                                            timeout=5) as reply:
                    if reply.status == 200:
                        return process
            except OSError:
                pass
            if process.poll() is not None or time.time() > deadline:
                pytest.fail(f"{command[0]} did not come up:\n" + log.read_text()[-2000:])
            time.sleep(1)

    def mlflow(self, backend_store_uri: str, port: int | None = None, *,
               cwd: Path | None = None, log: Path | None = None, timeout: float = 200):
        """`mlflow server` over `backend_store_uri` on loopback (on a free port unless given),
        one worker and no job runner (it starts four more Python processes no test uses), its
        output in `log` (mlflow-server.log in the test's folder unless given); returns (its URL,
        its process) once it answers."""
        import sys

        port = port or free_port()
        command = [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                   backend_store_uri, "--host", "127.0.0.1", "--port", str(port),
                   "--workers", "1"]
        process = self.start(command, port, log=log or self.folder / "mlflow-server.log",
                             env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
                             cwd=cwd, timeout=timeout)
        return f"http://127.0.0.1:{port}", process


def stop_session(process, timeout: float = 60, *, leader_only: bool = False) -> None:
    """SIGTERM (or the process's `stop_signal`) to the session `process` leads, then SIGKILL
    to whatever is left in it after `timeout` seconds. `leader_only`: the SIGTERM to `process`
    alone (`ray start --block` stops its node's processes itself)."""
    import signal
    import subprocess

    if leader_only:
        if process.poll() is None:
            process.terminate()
    else:
        try:  # SIGTERM unless the server names another stop (tests/support/postgres.py)
            os.killpg(process.pid, getattr(process, "stop_signal", signal.SIGTERM))
        except ProcessLookupError:  # the whole session has ended already
            pass
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)
