"""End to end on a two-node cluster: `ray start --head` and a worker node (`ray start --address`) on
loopback sharing local storage, a PostgreSQL server (tests/support/postgres.py) holding the MLflow
server's backend store and the Optuna studies, its password in the environment (PGPASSWORD) as
docs/cluster.md advises, an MLflow server (cluster/mlflow-server.sh, proxied artifacts) on
loopback, `ray job submit -- python sweeps/base2novel.py` over three datasets,
two searched side by side, the driver stopped once the first is done and resubmitted with --resume,
then every run and artifact checked in the server and `vacsr best` run against it. (The sweep's
default of all 11 datasets is tested in tests/sweep/test_sweep_space.py, each one's layout in
tests/data/test_data_classification.py.)"""
from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO
from tests.support.postgres import PASSWORD as PG_PASSWORD
from tests.support.postgres import create_database, start_postgresql
from tests.support.servers import free_port, stop_session
from vacsr.records.artifacts import SWEEP_COST

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1200)]

BIN = Path(sys.executable).parent


AUTH_TOKEN = secrets.token_hex(32)
# two datasets searched at once, a trial holding 1 CPU (--cpus-per-worker 1: a one-worker trial
# trains in its actor), over two nodes of 1 CPU each: their trials run on both nodes. The third
# dataset starts when one of them is done, which is when the driver is stopped, so the resumed
# job has work left (three datasets at once could all finish within one status poll)
DATASETS = ("eurosat", "dtd", "caltech101")


def _env() -> dict:
    # Ray 2.60 turns token auth on for `ray start`: the cluster and the job client share the mode
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=AUTH_TOKEN, PGPASSWORD=PG_PASSWORD)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # the job's `python` is this venv's
    env.pop("RAY_ADDRESS", None)
    return env


def _start_node(args: list[str], log: Path) -> subprocess.Popen:
    """`ray start --block` in a session of its own: SIGTERM to it stops this node and nothing
    else (`ray stop` would stop every Ray instance on the machine, other tests' too)."""
    with open(log, "w") as out:  # the node keeps its own copy of the descriptor
        return subprocess.Popen([str(BIN / "ray"), "start", "--block", "--disable-usage-stats",
                                 "--num-gpus=0", "--node-ip-address=127.0.0.1", *args],
                                env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_started(node: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while "Ray runtime started" not in log.read_text():
        assert node.poll() is None and time.time() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)


@pytest.fixture
def ray_cluster(tmp_path):
    """A head and a worker node (1 CPU each) on loopback: two trials at once must use both.

    Every port the nodes listen on that has a fixed default is chosen free, and each node has a
    temp dir of its own, so the cluster runs beside other tests' local Ray instances."""
    dashboard, gcs, client = free_port(), free_port(), free_port()
    # each node gets its own temp dir, as on separate machines: nodes sharing one would
    # garbage-collect each other's copies of the job's working dir (Unix socket paths stay short)
    temps = [tempfile.mkdtemp(prefix=p, dir="/tmp") for p in ("vh", "vw")]
    nodes = []
    try:
        head_log = tmp_path / "ray-head.log"
        nodes.append(_start_node(
            ["--head", "--num-cpus=1", f"--port={gcs}", f"--ray-client-server-port={client}",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
             "--include-dashboard=true", f"--dashboard-agent-listen-port={free_port()}",
             f"--temp-dir={temps[0]}"], head_log))
        _wait_started(nodes[0], head_log)
        worker_log = tmp_path / "ray-worker.log"
        nodes.append(_start_node(
            [f"--address=127.0.0.1:{gcs}", "--num-cpus=1",
             f"--dashboard-agent-listen-port={free_port()}", f"--temp-dir={temps[1]}"],
            worker_log))
        _wait_started(nodes[1], worker_log)
        yield f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}"
    finally:
        for node in reversed(nodes):
            # SIGTERM lets `ray start --block` stop its node's processes; whatever is left in
            # its session after a minute is killed
            stop_session(node, leader_only=True)
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)


def _refuses_a_driver_without_the_token(gcs: str, tmp_path: Path, weights: Path) -> None:
    """A sweep joining the token-auth cluster without its token, or with another, is refused in
    one line before it writes anything (ray.init would retry for about 20 s, then fail with a
    traceback)."""
    wrong = {"RAY_AUTH_MODE": "disabled"}, {"RAY_AUTH_TOKEN": secrets.token_hex(32)}
    for change, why in zip(wrong, ("asks for a Ray auth token, and this machine sends none",
                                   "refuses this machine's Ray auth token")):
        out = subprocess.run(
            [sys.executable, "sweeps/base2novel.py", "--datasets", "eurosat", "--plan",
             "--storage", str(tmp_path / "refused"), "--ray-address", gcs,
             "--pretrained", str(weights)],
            cwd=REPO, env={**_env(), **change}, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stderr == (
            f"vacsr: error: --ray-address {gcs}: the cluster {why}; set RAY_AUTH_MODE=token and "
            "the cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), as "
            "on its nodes\n"), out.stderr[-2000:]
        assert not (tmp_path / "refused").exists()


@pytest.fixture
def postgresql(servers) -> str:
    """A PostgreSQL server: its URL with the user and no password (`postgresql://vacsr@...`)."""
    return start_postgresql(servers).replace(f":{PG_PASSWORD}@", "@")


@pytest.fixture
def mlflow_server(tmp_path, servers, postgresql):
    """cluster/mlflow-server.sh on loopback with its backend store on PostgreSQL, the URL as
    users write it, and a local artifact store: (its URL, the artifact store); `servers` stops
    it at the end of the test."""
    port, artifacts = free_port(), tmp_path / "mlflow-artifacts"
    backend = create_database(postgresql, "mlflow")
    env = dict(_env(), MLFLOW_BACKEND_STORE_URI=backend,
               MLFLOW_ARTIFACTS_DESTINATION=str(artifacts), MLFLOW_PORT=str(port),
               MLFLOW_BIN=str(BIN / "mlflow"), MLFLOW_WORKERS="1")
    servers.start([str(REPO / "cluster" / "mlflow-server.sh")], port,
                  log=tmp_path / "mlflow.log", env=env, timeout=120)
    return f"http://127.0.0.1:{port}", artifacts


def _submit(address: str, args: list[str], job_id: str) -> str:
    out = subprocess.run([str(BIN / "ray"), "job", "submit", f"--address={address}",
                          f"--submission-id={job_id}", "--working-dir", str(REPO), "--no-wait",
                          "--", "python", "sweeps/base2novel.py", *args],
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return job_id


# one JobSubmissionClient process for the whole test, answering one call per line: a fresh process
# per status poll paid Ray's import (about 2 CPU-seconds) every few seconds, on the two cores the
# cluster under test trains on
_CLIENT_LOOP = """
import json, sys
from ray.job_submission import JobSubmissionClient
client = JobSubmissionClient(sys.argv[1])
for line in sys.stdin:
    try:
        result = eval("client." + line.strip())
        sys.stdout.write(json.dumps({"value": str(getattr(result, "value", result))}) + "\\n")
    except Exception as exc:
        sys.stdout.write(json.dumps({"error": repr(exc)[:2000]}) + "\\n")
    sys.stdout.flush()
"""


class JobClient:
    """Ray's JobSubmissionClient in a process of its own: Ray caches the auth token per process,
    so an earlier ray.init in this one (other tests) must not decide which token it sends."""

    def __init__(self, address: str):
        self.process = subprocess.Popen([sys.executable, "-c", _CLIENT_LOOP, address], env=_env(),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)

    def call(self, call: str, timeout: float = 120) -> str:
        self.process.stdin.write(call + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"the job client gave no answer to {call} in {timeout} s"
        answer = json.loads(self.process.stdout.readline() or '{"error": "client exited"}')
        assert "error" not in answer, f"{call}: {answer['error']}"
        return answer["value"]

    def status(self, job: str) -> str:
        return self.call(f"get_job_status({job!r})").strip()

    def wait(self, job: str, until, timeout: float) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            status = self.status(job)
            if until(status):
                return status
            time.sleep(3)
        raise AssertionError(f"job {job} still {self.status(job)} after {timeout} s")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def _failure(logs: str) -> str:
    """What a failed job said: its error lines (Tune prints whole configs in them) and its end."""
    errors = [line[:400] for line in logs.splitlines()
              if "Error" in line or "error" in line or "FAILED" in line]
    return "\n".join(errors[-15:]) + "\n...\n" + logs[-1500:]


def test_sweep_job_resumes_and_records_everything(tmp_path, ray_cluster, mlflow_server,
                                                  postgresql, weights):
    (ray_head, gcs), (uri, artifacts) = ray_cluster, mlflow_server
    _refuses_a_driver_without_the_token(gcs, tmp_path, weights)
    storage = tmp_path / "sweeps"  # shared by both nodes (one machine)
    studies = create_database(postgresql, "optuna")
    args = ["--storage", str(storage), "--name", "smoke", "--tracking-uri", uri,
            "--optuna-storage", studies,
            "--datasets", ",".join(DATASETS),
            "--ray-storage", f"file://{tmp_path / 'ray-storage'}", "--parallel-datasets", "2",
            "--cpus-per-worker", "1",
            "--range", "train.epochs=int:1:1",
            "--pretrained", str(weights), "--trials", "1", "--seeds", "1"]
    state_file = storage / "smoke" / "sweep_state.json"

    def one_dataset_done(_status):
        if not state_file.is_file():
            return False
        done = [d for d in json.loads(state_file.read_text())["datasets"].values() if d.get("done")]
        return len(done) >= 1

    jobs = JobClient(ray_head)
    try:
        first = _submit(ray_head, args, "sweep-first")
        jobs.wait(first, lambda s: s in ("FAILED", "SUCCEEDED") or one_dataset_done(s), 600)
        jobs.call(f"stop_job({first!r})")  # the driver dies mid-sweep
        assert jobs.wait(first, lambda s: s not in ("RUNNING", "PENDING"), 120) == "STOPPED"

        second = _submit(ray_head, args + ["--resume"], "sweep-resumed")
        status = jobs.wait(second, lambda s: s in ("FAILED", "SUCCEEDED", "STOPPED"), 900)
        logs = jobs.call(f"get_job_logs({second!r})")
    finally:
        jobs.close()
    (tmp_path / "job.log").write_text(logs)
    assert status == "SUCCEEDED", _failure(logs)
    assert "| average |" in logs
    from vacsr.model.pretrained_cache import sha256_of

    assert json.loads(state_file.read_text())["weights"] == {"path": str(weights),
                                                             "sha256": sha256_of(weights)}

    import mlflow

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["vacsr-base2novel"])
    parents = runs[runs["tags.vacsr.kind"] == "base2novel"]
    assert len(parents) == 1 and parents.status.iloc[0] == "FINISHED"
    datasets = runs[runs["tags.mlflow.parentRunId"] == parents.run_id.iloc[0]]
    assert sorted(datasets["tags.vacsr.dataset"]) == sorted(DATASETS)
    assert (runs.status == "RUNNING").sum() == 0
    client = mlflow.MlflowClient(uri)
    # the run's cost estimate, its costs from the cluster before its first trial (vacsr/sweep/cost/)
    plan = json.loads(Path(client.download_artifacts(parents.run_id.iloc[0], SWEEP_COST,
                                                     str(tmp_path))).read_text())
    assert sorted(row["dataset"] for row in plan["datasets"]) == sorted(DATASETS)
    assert plan["totals"]["search_device_s"] > 0
    assert plan["costs_from"]["source"] in ("measured now", "sweep folder", "machine cache")
    assert parents["tags.vacsr.costs_from"].iloc[0] == plan["costs_from"]["source"]
    nodes = set()
    for _, dataset_run in datasets.iterrows():
        children = runs[runs["tags.mlflow.parentRunId"] == dataset_run.run_id]
        name = dataset_run["tags.vacsr.dataset"]
        trials = children[~children["tags.mlflow.runName"].str.contains("final")]
        assert len(trials) == 1, f"{name}: every trial counted once"
        final = children[children["tags.mlflow.runName"] == f"{name}-final-seed1"]
        assert len(final) == 1 and final["metrics.test/acc"].iloc[0] >= 0
        # the trial trained seed 1 to the end: its checkpoint is the final run's, not retrained
        assert final["tags.vacsr.reused_trial"].iloc[0] in trials["tags.vacsr.output_dir"].iloc[0]
        assert dataset_run["metrics.best_val/acc"] >= 0
        assert "best_config.yaml" in {a.path for a in client.list_artifacts(dataset_run.run_id)}
        trial = trials.iloc[0]
        assert trial["metrics.val/acc"] >= 0 and trial["params.data.dataset"] == name
        assert {"config.yaml", "metrics.json"} <= {a.path for a in client.list_artifacts(
            trial.run_id)}, f"{name}: trial artifacts missing in the server"
        nodes.add(trial["tags.vacsr.ray_node_id"])
    assert len(nodes) == 2, "trials ran on both nodes"
    # artifacts went through the server into its store, not to a client-side folder
    assert len(list(artifacts.rglob("metrics.json"))) >= len(DATASETS)
    assert not (storage / "smoke" / "mlartifacts").exists()

    best = subprocess.run([str(BIN / "vacsr"), "best", "--tracking-uri", uri, "--sweep", "smoke",
                           "--export", str(tmp_path / "best")], capture_output=True, text=True,
                          timeout=300, env=_env())
    assert best.returncode == 0, best.stderr[-2000:]
    assert "eurosat" in best.stdout and "loss.gamma=" in best.stdout
    exported = sorted(p.stem for p in (tmp_path / "best").glob("*.yaml"))
    assert len(exported) == len(DATASETS)
    from vacsr.config import load_config

    config = load_config(tmp_path / "best" / "eurosat.yaml")  # accepted unchanged by vacsr train
    assert config.data.dataset == "eurosat"
