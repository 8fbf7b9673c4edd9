"""cluster/: the launcher config against the schema inside the ray wheel, the KubeRay manifests
structurally (kinds, GPU resources, secrets, the entrypoint's script and arguments), the runtime env
and the MLflow server script's defaults."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import REPO

CLUSTER = REPO / "cluster"
LAUNCHER = CLUSTER / "launcher" / "aws-gpu.yaml"
KUBERAY = CLUSTER / "kuberay"
SECRET_NAMES = re.compile(r"TOKEN|PASSWORD|SECRET|ACCESS_KEY|BACKEND_STORE_URI", re.IGNORECASE)


def _load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kind(kind: str) -> dict:
    docs = [d for p in sorted(KUBERAY.glob("*.yaml")) for d in _load(p) if d["kind"] == kind]
    assert len(docs) == 1, f"expected one {kind} manifest, found {len(docs)}"
    return docs[0]


# ---------------------------------------------------------------- cluster launcher
def test_launcher_config_matches_the_schema_shipped_with_ray():
    import ray.autoscaler
    from ray.autoscaler._private.util import validate_config

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    config = yaml.safe_load(LAUNCHER.read_text())
    jsonschema.validate(config, schema)
    validate_config(config)  # Ray's own checks on top of the schema (node types, head type)


def test_launcher_head_has_no_gpus_and_gpu_workers_autoscale():
    config = yaml.safe_load(LAUNCHER.read_text())
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"].get("GPU", 0) == 0
    workers = {name: t for name, t in types.items() if name != config["head_node_type"]}
    gpu = {name: t for name, t in workers.items() if t["resources"].get("GPU", 0) >= 1}
    assert gpu, "no GPU worker node type"
    for name, node in gpu.items():
        assert node.get("min_workers", 0) == 0 < node["max_workers"], name
        assert node["max_workers"] <= config["max_workers"], name
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start and "--num-gpus=0" in head_start
    for commands in (config["head_start_ray_commands"], config["worker_start_ray_commands"]):
        start = [c for c in commands if "ray start" in c]
        assert start and all("RAY_AUTH_MODE=token" in c for c in start)


def test_launcher_config_embeds_no_credentials():
    text = LAUNCHER.read_text()
    assert not re.search(r"AKIA[0-9A-Z]{16}", text)  # AWS access key ids
    assert not re.search(r"(?i)(password|secret_access_key|auth_token)\s*[:=]\s*\S", text)
    assert not re.search(r"RAY_AUTH_TOKEN=\S", text)  # only a token *path* is passed


# ---------------------------------------------------------------- KubeRay
def _pod_specs(cluster_spec: dict) -> list[tuple[str, dict]]:
    pods = [("head", cluster_spec["headGroupSpec"]["template"]["spec"])]
    pods += [(g["groupName"], g["template"]["spec"]) for g in cluster_spec["workerGroupSpecs"]]
    return pods


def _check_cluster_spec(spec: dict) -> None:
    assert spec["rayVersion"].startswith("2.60")
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    gpu_groups = [g for g in spec["workerGroupSpecs"]
                  if any(int(c["resources"]["limits"].get("nvidia.com/gpu", 0)) >= 1
                         for c in g["template"]["spec"]["containers"])]
    assert gpu_groups, "no GPU worker group"
    for group in gpu_groups:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        for container in group["template"]["spec"]["containers"]:
            limits, requests = container["resources"]["limits"], container["resources"]["requests"]
            assert limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"]
    for name, pod in _pod_specs(spec):
        claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}
        assert "vacsr-shared" in claims, f"{name}: no shared storage"
        for container in pod["containers"]:
            assert container["image"], name
            assert {"name": "shared", "mountPath": "/shared"} in container["volumeMounts"]
            _check_env(container, name)


def _check_env(container: dict, where: str) -> None:
    env = {e["name"]: e for e in container.get("env", [])}
    assert env["RAY_AUTH_MODE"]["value"] == "token", where
    for name, entry in env.items():
        if SECRET_NAMES.search(name):
            assert "value" not in entry, f"{where}: {name} holds a literal value"
            assert entry["valueFrom"]["secretKeyRef"]["name"], f"{where}: {name}"


def test_raycluster_manifest_structure():
    cluster = _kind("RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["metadata"]["name"]
    _check_cluster_spec(cluster["spec"])


def test_rayjob_entrypoint_runs_an_existing_sweep_with_valid_arguments():
    from sweeps.base2novel import SWEEP
    from vacsr.sweep.plan.command_line import _datasets
    from vacsr.sweep.plan.flags import build_parser
    from vacsr.sweep.plan.inputs import check_ray_storage
    from vacsr.sweep.spec.space import parse_range

    job = _kind("RayJob")
    assert job["apiVersion"] == "ray.io/v1"
    _check_cluster_spec(job["spec"]["rayClusterSpec"])
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[0] == "python" and argv[1] == "sweeps/base2novel.py"
    assert (REPO / argv[1]).is_file()
    args = build_parser(SWEEP).parse_args(argv[2:])  # SystemExit on a bad flag
    _datasets(SWEEP, args.datasets)
    check_ray_storage(args.ray_storage)
    for text in args.range:
        parse_range(text)
    assert args.gpus_per_worker >= 1 and args.data_root and args.storage.startswith("/shared")
    assert args.tracking_uri.startswith("http://")
    runtime_env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    assert runtime_env["working_dir"] == "/home/ray/vacsr"  # where cluster/Dockerfile puts it
    submitter = job["spec"]["submitterPodTemplate"]["spec"]["containers"][0]
    _check_env(submitter, "submitter")  # the job client holds the same token as the cluster


def test_mlflow_manifest_reads_the_database_uri_from_a_secret():
    deployment, service = _kind("Deployment"), _kind("Service")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert "secretKeyRef" in env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]
    assert container["command"][0].endswith("cluster/mlflow-server.sh")
    assert service["spec"]["type"] == "ClusterIP"
    assert _kind("PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]


def test_runtime_env_file_is_a_valid_ray_runtime_env():
    from ray.runtime_env import RuntimeEnv

    payload = yaml.safe_load((CLUSTER / "runtime_env.yaml").read_text())
    RuntimeEnv(**payload)  # unknown fields or bad types raise
    assert all(isinstance(v, str) for v in payload["env_vars"].values())
    assert payload["env_vars"]["RAY_CHDIR_TO_TRIAL_DIR"] == "0"


def test_dockerfile_copies_what_exists():
    for line in (CLUSTER / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY"):
            for source in shlex.split(line)[1:-1]:
                if not source.startswith("--"):
                    assert (REPO / source).exists(), source


@pytest.mark.parametrize("missing", ["MLFLOW_BACKEND_STORE_URI", "MLFLOW_ARTIFACTS_DESTINATION"])
def test_mlflow_server_script_requires_its_settings(tmp_path, missing):
    import subprocess

    env = {"PATH": "/usr/bin:/bin", "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path}/m.db",
           "MLFLOW_ARTIFACTS_DESTINATION": str(tmp_path / "a"), "MLFLOW_BIN": "/bin/false"}
    del env[missing]
    out = subprocess.run([str(CLUSTER / "mlflow-server.sh")], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode != 0 and missing in out.stderr


@pytest.mark.parametrize("asked, runs", [(None, "false"), ("true", "true")])
def test_mlflow_server_script_starts_no_job_runner_unless_asked(tmp_path, asked, runs):
    """MLflow's job runner (four more processes vacsr never uses) is off unless the environment
    turns it on; the server gets its workers and proxied artifacts."""
    import subprocess

    fake = tmp_path / "mlflow"  # stands in for the server: says what it was started with
    fake.write_text('#!/bin/sh\necho "jobs=$MLFLOW_SERVER_ENABLE_JOB_EXECUTION $*"\n')
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path}/m.db",
           "MLFLOW_ARTIFACTS_DESTINATION": str(tmp_path / "a"), "MLFLOW_BIN": str(fake)}
    if asked:
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = asked
    out = subprocess.run([str(CLUSTER / "mlflow-server.sh")], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"jobs={runs} server --backend-store-uri sqlite:///"), out.stdout
    assert "--serve-artifacts" in out.stdout and "--workers 2" in out.stdout
