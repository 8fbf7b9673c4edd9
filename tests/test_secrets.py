"""A password in the tracking URI reaches MLflow (through its own environment variables) and
nothing else: no console line, log record, param, artifact or file holds it."""
from __future__ import annotations

import base64
import http.server
import logging
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PASSWORD = "s3cr3t-pw"
USER = "vacsr"


def _auth_proxy(upstream: str) -> tuple[http.server.ThreadingHTTPServer, int]:
    """Basic auth in front of `mlflow server` (this venv has no mlflow[auth]): a request without
    USER:PASSWORD gets 401, so a run logs only if the credentials reach MLflow's requests."""
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

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

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


@pytest.fixture
def mlflow_server(tmp_path, servers):
    """`mlflow server` over a SQLite store behind the auth proxy: (the store's folder, the
    proxy's port)."""
    store = tmp_path / "server"
    store.mkdir()
    url, _ = servers.mlflow(f"sqlite:///{store / 'mlflow.db'}", cwd=store)
    proxy, proxy_port = _auth_proxy(url)
    try:
        yield store, proxy_port
    finally:
        proxy.shutdown()  # before `servers` stops the server


def test_a_password_in_the_uri_reaches_mlflow_and_nothing_else(tmp_path, mlflow_server,
                                                               monkeypatch, capsys, caplog):
    from mlflow import MlflowClient

    from vacsr.cli import main
    from vacsr.model.backbone import create_clip

    store, port = mlflow_server
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    weights = tmp_path / "random-tiny.pt"
    torch.save(create_clip("vacsr-tiny")[0].state_dict(), weights)
    uri = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}"
    caplog.set_level(logging.DEBUG)
    code = main(["train", f"model.pretrained={weights}", "data.num_train=16", "data.num_test=10",
                 "train.batch_size=16", "train.epochs=1", "adapter.hidden_dim=16",
                 "data.augment=false", "train.progress=false", "train.device=cpu",
                 "tracking.enabled=true", f"tracking.uri={uri}",
                 f"train.output_dir={tmp_path / 'run'}"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "View run" in out  # MLflow's own line is there, without the password
    shown = f"http://{USER}:***@127.0.0.1:{port}"
    assert PASSWORD not in out + err + caplog.text
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
    assert leaks == []  # run folder (config.yaml, last.ckpt, mlflow_run.json), server store
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    client = MlflowClient(f"http://127.0.0.1:{port}")
    [run] = client.search_runs([client.get_experiment_by_name("vacsr-train").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["tracking.uri"] == shown
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "config.yaml" in artifacts and any(store.rglob("config.yaml"))


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_a_password_in_the_uri_stays_out_of_a_sweep(tmp_path, mlflow_server, weights,
                                                    monkeypatch):
    """A whole sweep (trial, selection, final seed run, report, the MLflow UI hint) with the
    password in --tracking-uri: its runs reach the server, and neither the console, the sweep
    folder, the server's store nor the Ray instance's session folder (logs included) holds it."""
    import tempfile

    from mlflow import MlflowClient

    store, port = mlflow_server
    ray_temp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))  # short: Ray's socket paths
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=str(ray_temp))
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
                 "MLFLOW_TRACKING_PASSWORD"):
        env.pop(name, None)
    uri = f"http://{USER}:{PASSWORD}@127.0.0.1:{port}"
    try:
        out = subprocess.run(
            [sys.executable, "sweeps/base2novel.py", "--datasets", "eurosat", "--storage",
             str(tmp_path / "sweeps"), "--pretrained", str(weights), "--trials", "1",
             "--seeds", "1", "--range", "train.epochs=int:1:1", "--tracking-uri", uri],
            cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
            timeout=540)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert f"http://{USER}:***@127.0.0.1:{port}" in out.stdout  # the UI hint, redacted
        assert PASSWORD not in out.stdout + out.stderr
        files = [p for root in (tmp_path, ray_temp) for p in root.rglob("*")
                 if p.is_file() and not p.is_symlink() and not p.is_socket()]
        assert any(p.name == "best_config.yaml" for p in files)  # what was searched is there
        assert any("logs" in p.parts for p in files)  # so are Ray's session logs
        assert [p for p in files if PASSWORD.encode() in p.read_bytes()] == []
    finally:
        subprocess.run(["rm", "-rf", str(ray_temp)], timeout=60)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    client = MlflowClient(f"http://127.0.0.1:{port}")
    runs = client.search_runs([client.get_experiment_by_name("vacsr-base2novel").experiment_id])
    assert {r.info.status for r in runs} == {"FINISHED"} and len(runs) == 4  # sweep, dataset,
    assert not [r for r in runs for value in r.data.params.values()  # trial, final seed
                if PASSWORD in value]
