"""Bad inputs to the `vacsr` commands, each refused before any work: exit status 2, one
`vacsr: error:` line naming the file or value, and nothing written. Also the ownership of a run
folder (two `vacsr train` into one folder) and of a new MLflow store (two processes creating it).

Inputs that made the old code exhaust memory run in a subprocess whose address space is capped,
so that such a failure stays a MemoryError of that process.
"""
from __future__ import annotations

import base64
import contextlib
import http.server
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import http_serving, one_line

TINY = ["data.num_train=8", "data.num_test=10", "train.batch_size=16", "train.epochs=1",
        "adapter.hidden_dim=16", "data.augment=false", "train.progress=false",
        "train.device=cpu"]
MEMORY_CAP = 4 << 30  # address space of a capped subprocess: torch imports in it
# nine levels of nine aliases: 9**9 entries once expanded, from 300 bytes of text
ALIAS_BOMB = "[&a [" + ", ".join(['"lol"'] * 9) + "]" + "".join(
    f", &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")) + "]"


def _cli(argv, *, cwd: Path | None = None, cap_memory: bool = False, timeout: float = 300,
         **popen) -> subprocess.CompletedProcess:
    """`python -m vacsr.cli ARGV` of the tree under test (the one pytest runs in)."""
    limit = (lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
             ) if cap_memory else None
    return subprocess.run([sys.executable, "-m", "vacsr.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          preexec_fn=limit, env={**os.environ, "PYTHONPATH": os.getcwd()},
                          **popen)


def _refused(out: subprocess.CompletedProcess) -> str:
    """The one stderr line of a refused subprocess (exit status 2)."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("vacsr: error: "), lines[-5:]
    return lines[0]


@pytest.fixture
def no_model_built(monkeypatch):
    """A command must be refused before a Trainer builds the model or generates data."""
    from vacsr.train import loop

    def built(*args, **kwargs):
        raise AssertionError("the model was built before the input was checked")

    monkeypatch.setattr(loop.Trainer, "__init__", built)


# ---------------------------------------------------------------- A: config text
@pytest.mark.parametrize("where", ["override", "config-file"])
def test_yaml_alias_bomb_is_one_line(tmp_path, where):
    config = tmp_path / "bomb.yaml"
    config.write_text(f"loss:\n  gamma: {ALIAS_BOMB}\n")
    given = [f"loss.gamma={ALIAS_BOMB}"] if where == "override" else ["--config", config]
    line = _refused(_cli(["train", *given, f"train.output_dir={tmp_path / 'run'}"],
                         cap_memory=True))
    assert "YAML alias *a" in line and "no anchors or aliases" in line, line
    assert (f"{config}: holds" in line) if where == "config-file" else "loss.gamma=" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.yaml"]


def test_deeply_nested_override_is_one_line(tmp_path, capsys):
    nested = "[" * 5000 + "]" * 5000
    line = one_line(["train", f"optim.decay_epochs={nested}",
                      f"train.output_dir={tmp_path / 'run'}"], capsys)
    assert "override 'optim.decay_epochs=[[[" in line and "nested deeper than 16" in line
    assert len(line) < 400 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", ["99999999999999999999", "-1", "4294967296"])
def test_a_seed_out_of_every_librarys_range_is_one_line(tmp_path, capsys, seed):
    """numpy seeds from 0 to 2**32 - 1: a larger seed failed in the run (or every trial)."""
    line = one_line(["train", f"train.seed={seed}", f"train.output_dir={tmp_path / 'run'}"],
                    capsys)
    assert line == f"vacsr: error: train.seed: expected 0 to 4294967295, got {seed}"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- B: the run folder
@pytest.mark.parametrize("kind", ["file", "dev-null", "below-a-file"])
def test_output_dir_that_is_no_folder(tmp_path, capsys, weights, no_model_built, kind):
    (tmp_path / "taken").write_text("a file\n")
    out = {"file": tmp_path / "taken", "dev-null": Path("/dev/null"),
           "below-a-file": tmp_path / "taken" / "run"}[kind]
    line = one_line(["train", *TINY, f"model.pretrained={weights}",
                      f"train.output_dir={out}"], capsys)
    assert line.startswith(f"vacsr: error: {out}: ") and "expected a folder for the run" in line
    assert ("a character device" if kind == "dev-null" else f"{tmp_path / 'taken'} is a file"
            if kind == "below-a-file" else "is a file") in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert (tmp_path / "taken").read_text() == "a file\n"


@pytest.mark.parametrize("inside", [False, True], ids=["read-only-folder", "missing-below-it"])
def test_read_only_output_dir(tmp_path, capsys, weights, read_only, no_model_built, inside):
    (tmp_path / "ro").mkdir()
    folder = read_only(tmp_path / "ro")
    out = folder / "run" if inside else folder
    line = one_line(["train", *TINY, f"model.pretrained={weights}",
                      f"train.output_dir={out}"], capsys)
    assert f"{out}: cannot write (" in line and "expected a writable folder for the run" in line
    assert list(folder.iterdir()) == []


# ---------------------------------------------------------------- C: synthetic sizes
@pytest.mark.parametrize("key", ["data.num_train", "data.num_test"])
def test_huge_synthetic_split_is_refused_at_validation(tmp_path, key):
    line = _refused(_cli(["train", "data.image_size=1024", f"{key}=1000000", "train.device=cpu",
                          f"train.output_dir={tmp_path / 'run'}"], cap_memory=True))
    assert f"{key}: expected 1 to 682 images of 1024x1024 pixels" in line
    assert "got 1000000" in line and list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- D: checkpoint payloads
def test_eval_checkpoint_whose_model_entry_is_a_list(tmp_path, capsys, no_model_built):
    torch.save({"model": [1, 2], "epoch": 0}, tmp_path / "list.ckpt")
    line = one_line(["eval", "--checkpoint", tmp_path / "list.ckpt", *TINY[:3]], capsys)
    assert f"{tmp_path / 'list.ckpt'}: its 'model' entry holds a list, expected a state dict" \
        in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["list.ckpt"]


def test_eval_of_another_shape_without_its_config_is_one_line_in_a_process(tmp_path):
    """The whole stderr: open_clip's notice that the backbone starts random (its weights come
    from the checkpoint) is no second line."""
    from vacsr.config import load_config
    from vacsr.model.vacsr import build_model

    model = build_model(load_config(overrides=[*TINY, "adapter.hidden_dim=24"]))
    torch.save({"model": model.state_dict()}, tmp_path / "bare.ckpt")
    line = _refused(_cli(["eval", "--checkpoint", tmp_path / "bare.ckpt", *TINY]))
    assert f"{tmp_path / 'bare.ckpt'}: does not fit the model of this config" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare.ckpt"]


# ---------------------------------------------------------------- E: vacsr best reads only
def test_best_on_a_missing_store_creates_none(tmp_path, capsys):
    db = tmp_path / "nothere" / "mlflow.db"
    line = one_line(["best", "--tracking-uri", f"sqlite:///{db}"], capsys)
    assert f"no MLflow store at {db} (no such file)" in line
    assert list(tmp_path.iterdir()) == []


def test_best_without_a_uri_creates_no_store_here(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    line = one_line(["best"], capsys)
    assert f"no MLflow store at {tmp_path / 'mlflow.db'}" in line and "--tracking-uri" in line
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- F, G: pretrain-tiny, demo
def test_pretrain_into_a_missing_folder_on_a_read_only_file_system(tmp_path, capsys,
                                                                    read_only):
    (tmp_path / "ro").mkdir()
    folder = read_only(tmp_path / "ro")
    out = folder / "missing" / "w.pt"
    line = one_line(["pretrain-tiny", "--out", out, "--num-images", "26", "--epochs", "1"],
                     capsys)
    assert f"{out}: cannot write (" in line and "for the pretrained weights" in line
    assert list(folder.iterdir()) == []


def test_demo_whose_work_folder_is_a_file_checks_it_first(tmp_path, capsys, monkeypatch):
    import vacsr.demo

    def pretrain(*args, **kwargs):
        raise AssertionError("pretraining started before the work folder was checked")

    monkeypatch.setattr(vacsr.demo, "install_pretrained", pretrain)
    (tmp_path / "work").write_text("a file\n")
    line = one_line(["demo", "--workdir", tmp_path / "work"], capsys)
    assert f"{tmp_path / 'work'}: is a file; expected a folder for the demo" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


# ---------------------------------------------------------------- H: one run folder, one run
def _wait_for(predicate, timeout_s: float, what: str, process=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what}: the process ended ({process.returncode}): "
                                 f"{process.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_second_train_into_a_running_folder_is_refused(tmp_path, weights):
    """Two real `vacsr train` into one folder with other settings: the second is refused naming
    the first's pid and host while the first runs (stopped with SIGSTOP so that it surely still
    does), and the first then ends with records of its own settings only."""
    run = tmp_path / "run"
    argv = ["train", *TINY, "train.epochs=3", f"model.pretrained={weights}",
            f"train.output_dir={run}"]
    first = subprocess.Popen([sys.executable, "-m", "vacsr.cli", *map(str, argv)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        _wait_for(lambda: (run / "config.yaml").is_file(), 240, "the first run's config.yaml",
                  first)
        os.kill(first.pid, signal.SIGSTOP)
        time.sleep(1.0)
        second = _cli([*argv, "optim.lr=0.002", "train.seed=7"])
        os.kill(first.pid, signal.SIGCONT)
        line = _refused(second)
        assert f"{run}: another vacsr train is running in this folder (pid {first.pid} on " \
               f"{socket.gethostname()})" in line
        assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            first.kill()
            first.wait()
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["optim"]["lr"], config["train"]["seed"]) == (0.0005, 1)
    state = torch.load(run / "last.ckpt", weights_only=True)
    assert state["epoch"] == 2 and state["config"] == config and len(state["history"]) == 3
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "last.ckpt", "metrics.json"]


_HOLD_RUN_FOLDER = """
import sys, time
from vacsr.config import load_config
from vacsr.train.run_folder import lock_run_folder
lock_run_folder(load_config(overrides=["train.output_dir=" + sys.argv[1]]))
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _hold_run_folder(folder: Path, seconds: float, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _HOLD_RUN_FOLDER, str(folder), str(seconds)],
                            text=True, env={**os.environ, "PYTHONPATH": os.getcwd()}, **popen)


def test_a_run_folder_lock_is_reentrant_in_its_process_and_dropped_when_it_dies(tmp_path):
    """The CLI and the train() it calls both hold the folder; another process is refused while
    they do; release removes the lock file and the folders made for it; a SIGKILLed holder's
    lock is dropped by the kernel."""
    from vacsr.config import load_config
    from vacsr.errors import ConfigError
    from vacsr.train.run_folder import lock_run_folder

    run = tmp_path / "a" / "run"
    config = load_config(overrides=[f"train.output_dir={run}"])
    outer = lock_run_folder(config)
    lock_run_folder(config).release()  # the library entry inside the command
    other = _hold_run_folder(run, 0, stderr=subprocess.PIPE)
    assert other.wait(timeout=120) != 0
    assert f"another vacsr train is running in this folder (pid {os.getpid()} on " \
           f"{socket.gethostname()})" in other.stderr.read()
    outer.release()
    assert list(tmp_path.iterdir()) == []
    killed = _hold_run_folder(run, 120, stdout=subprocess.PIPE)
    try:
        assert killed.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"pid {killed.pid} on"):
            lock_run_folder(config)
    finally:
        killed.kill()
        killed.wait()
    lock_run_folder(config).release()  # the kernel dropped the killed holder's lock


# ---------------------------------------------------------------- I: creating one store at once
_OPEN_STORE = """
import sys, time
from pathlib import Path
from vacsr.records.tracker import MlflowTracker
Path(sys.argv[2]).touch()
while not Path(sys.argv[3]).exists():
    time.sleep(0.001)
tracker = MlflowTracker("sqlite:///" + sys.argv[1])
print(len(tracker.client.search_experiments()))
"""


def test_processes_creating_one_store_at_once_all_succeed(tmp_path):
    db, go = tmp_path / "store" / "mlflow.db", tmp_path / "go"
    db.parent.mkdir()
    ready = [tmp_path / f"ready-{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN_STORE, str(db), str(mark), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()}) for mark in ready]
    try:
        _wait_for(lambda: all(mark.exists() for mark in ready), 240, "the processes to start")
        go.touch()  # all at once
        outs = [proc.communicate(timeout=240) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err[-1500:] for _, err in outs]
    assert [out.strip() for out, _ in outs] == ["1", "1", "1"]  # the Default experiment


# ---------------------------------------------------------------- J: the tracking server
@contextlib.contextmanager
def _serving(status: int, body: bytes, accepted: str | None = None):
    """A local server answering `status` and the JSON `body` to every request, or, to requests
    whose Authorization header is `accepted`, what MLflow answers for a missing experiment."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            ok = accepted is not None and self.headers.get("Authorization") == accepted
            answer = b'{"error_code": "RESOURCE_DOES_NOT_EXIST"}' if ok else body
            self.send_response(404 if ok else status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    with http_serving(Handler) as uri:
        yield uri


REFUSED = b'{"error_code": "UNAUTHENTICATED", "message": "wrong credentials"}'


@pytest.fixture
def no_mlflow_credentials(monkeypatch):
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                 "MLFLOW_TRACKING_AUTH", "MLFLOW_TRACKING_AWS_SIGV4"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")  # no ~/.mlflow/credentials


@pytest.mark.parametrize("status", [401, 403])
def test_train_with_refused_credentials_is_one_line(tmp_path, capsys, weights, status,
                                                    no_mlflow_credentials, no_model_built):
    with _serving(status, REFUSED) as uri:
        given = uri.replace("//", "//alice:wrong@")
        line = one_line(["train", *TINY, f"model.pretrained={weights}", "tracking.enabled=true",
                          f"tracking.uri={given}", f"train.output_dir={tmp_path / 'run'}"],
                         capsys)
    shown = uri.replace("//", "//alice:***@")
    assert line.startswith(f"vacsr: error: MLflow tracking URI {shown}: the server refused the "
                           f"credentials (HTTP {status}; sent user 'alice' and a password)")
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        assert name in line
    assert "wrong" not in line and list(tmp_path.iterdir()) == []


def test_tracking_check_sends_the_credentials_mlflow_would(no_mlflow_credentials, monkeypatch):
    from vacsr.errors import ConfigError
    from vacsr.records import check_tracking_uri

    basic = "Basic " + base64.b64encode(b"alice:right").decode()
    with _serving(401, REFUSED, accepted=basic) as uri:
        check_tracking_uri(uri.replace("//", "//alice:right@"), timeout_s=2.0)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "right")
        check_tracking_uri(uri, timeout_s=2.0)
    with _serving(403, REFUSED, accepted="Bearer t0ken") as uri:
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "t0ken")
        check_tracking_uri(uri, timeout_s=2.0)
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "other")
        with pytest.raises(ConfigError, match=r"HTTP 403; sent the token in MLFLOW_TRACKING_TOKEN"):
            check_tracking_uri(uri, timeout_s=2.0)


def test_json_server_that_is_not_mlflow_leaves_no_run_folder(tmp_path, capsys, weights,
                                                             no_model_built):
    with _serving(200, b'{"status": "ok"}') as uri:
        line = one_line(["train", *TINY, f"model.pretrained={weights}", "tracking.enabled=true",
                          f"tracking.uri={uri}", f"train.output_dir={tmp_path / 'run'}"],
                         capsys)
    assert f"MLflow tracking URI {uri}: answered, but not as an MLflow tracking server" in line
    assert list(tmp_path.iterdir()) == []
