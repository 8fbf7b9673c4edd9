"""A sweep at cluster scale, rehearsed on this machine: a local Ray cluster of several nodes with
logical GPUs (`ray.cluster_utils.Cluster`, Ray's own multi-node helper: a raylet per node, no
CUDA), a PostgreSQL server behind the Optuna studies and an MLflow server (its backend store on
PostgreSQL too), and `sweeps/base2novel.py --rehearse` of every method on the 11 datasets, a GPU
per trial. Its `--plan` first, for the predicted wall time.

    .venv/bin/python benchmarks/bench_scale.py --nodes 4 --gpus-per-node 8 --trials 24 \\
        --seeds 1,2,3 --scale 200

It prints, per phase (the search, the final seeds with their evaluations), read from the MLflow
runs' start and end times: GPU-seconds held by runs / GPU-seconds the cluster had over the
phase's wall time, and against the phase's minimum (its runs' waits / the GPUs); the framework's
overhead per run (a run's wall time beyond its waits, `rehearsal/wait_s`); MLflow writes per
second; the driver's peak memory; failed units; the driver's error lines; and `--plan`'s wall
time (scaled) against the rehearsal's. Linux only; a sweep folder under --storage (a temporary
one unless given, removed after).

`--against-free-running` rehearses the sweep a second time on the same cluster with
`--free-running` (no waits, a table that depends on timing) and prints what the deterministic
search costs: its search-phase wall time and GPU use against the free-running one's, at the same
number of trials per dataset at once. `--draw-slack 0,1` rehearses the deterministic search once
per slack (the sweep's `--draw-slack`: trial k's draw reads trials 0..k-N-S), each against the
one free-running rehearsal.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.postgres import create_database, start_postgresql  # noqa: E402
from tests.support.servers import Servers  # noqa: E402

WAIT = "rehearsal/wait_s"  # vacsr/sweep/rehearsal/run.py WAIT_METRIC


def start_cluster(nodes: int, gpus: int, cpus: int):
    """A head and nodes - 1 more, each with `gpus` logical GPUs and `cpus` logical CPUs."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": cpus, "num_gpus": gpus, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cpus, num_gpus=gpus)
    cluster.wait_for_nodes()
    return cluster


def sweep_command(args, address: str, uri: str, studies: str, storage: Path, *extra: str):
    return [sys.executable, "sweeps/base2novel.py", "--ray-address", address, "--storage",
            str(storage), "--tracking-uri", uri, "--optuna-storage", studies, "--methods",
            args.methods, "--trials", str(args.trials), "--seeds", args.seeds,
            "--gpus-per-worker", "1", "--cpus-per-worker", "1", "--set", "train.device=cpu",
            *(["--concurrent-trials", str(args.concurrent_trials)]
              if args.concurrent_trials else []),
            *(["--datasets", args.datasets] if args.datasets else []), *extra]


def run_driver(command: list[str], log: Path, env: dict) -> tuple[int, float, float]:
    """(exit status, wall s, the largest child's peak RSS in MiB so far) of the driver."""
    start = time.time()
    with open(log, "w") as out:
        code = subprocess.run(command, cwd=ROOT, env=env, stdout=out,
                              stderr=subprocess.STDOUT).returncode
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return code, time.time() - start, peak


def phase(runs: list, gpus: float) -> dict:
    """Held and available GPU-seconds over the phase's runs' span, and their overheads."""
    if not runs:
        return {}
    start = min(r.info.start_time for r in runs) / 1000
    end = max(r.info.end_time or r.info.start_time for r in runs) / 1000
    walls = [((r.info.end_time or r.info.start_time) - r.info.start_time) / 1000 for r in runs]
    waits = [r.data.metrics.get("rehearsal/wait_total_s", 0.0) for r in runs]
    held = sum(walls)  # a GPU per run
    return {"runs": len(runs), "wall_s": end - start, "held_gpu_s": held,
            "use": held / (gpus * (end - start)) if end > start else 0.0,
            "minimum_s": sum(waits) / gpus, "overhead_s": [w - t for w, t in zip(walls, waits)]}


def read_runs(uri: str, since: float = 0.0) -> list:
    """The experiment's runs started at `since` (epoch seconds) or later."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("vacsr-base2novel")
    runs = [r for r in client.search_runs([experiment.experiment_id], max_results=50000)
            if r.info.start_time >= since * 1000]
    for run in runs:  # a run's waits: its history of rehearsal/wait_s
        if WAIT in run.data.metrics:
            history = client.get_metric_history(run.info.run_id, WAIT)
            run.data.metrics["rehearsal/wait_total_s"] = sum(m.value for m in history)
    return runs


def report(args, runs: list, wall: float, plan_wall: float, peak: float, log: Path) -> dict:
    gpus = args.nodes * args.gpus_per_node
    trials = [r for r in runs if WAIT in r.data.metrics and "final" not in r.info.run_name]
    finals = [r for r in runs if "final-seed" in (r.info.run_name or "")]
    metrics_logged = sum(len(r.data.metrics) * max(1, int(r.data.metrics.get("epoch", 1)))
                         for r in runs)
    print(f"cluster: {args.nodes} node(s) x {args.gpus_per_node} logical GPUs = {gpus} GPUs; "
          f"methods {args.methods}, {args.trials} trials, seeds {args.seeds}, "
          f"--concurrent-trials {args.concurrent_trials or 'default'}, --rehearse "
          f"{args.scale:g}")
    phases = {}
    for name, found in (("search", trials), ("final seeds", finals)):
        p = phases[name] = phase(found, gpus)
        if not p:
            continue
        overheads = sorted(p["overhead_s"])
        # runs that record no waits (under a second in all) have no minimum to compare with
        ratio = f"{p['wall_s'] / p['minimum_s']:.2f}" if p["minimum_s"] >= 1 else "n/a"
        print(f"{name}: {p['runs']} runs over {p['wall_s']:.0f} s; GPU-s held "
              f"{p['held_gpu_s']:.0f} of {gpus * p['wall_s']:.0f} ({100 * p['use']:.0f}%); its "
              f"minimum (waits / GPUs) {p['minimum_s']:.0f} s, wall / minimum "
              f"{ratio}; overhead per run median "
              f"{overheads[len(overheads) // 2]:.2f} s, max {overheads[-1]:.2f} s")
    failed = [line for line in log.read_text().splitlines() if "FAILED" in line
              or "error" in line.lower()]
    print(f"MLflow: {len(runs)} runs, about {metrics_logged} metric values, "
          f"{metrics_logged / wall:.1f} per s; driver peak RSS {peak:.0f} MiB; "
          f"{len(failed)} error line(s) in the driver's log")
    print(f"SUMMARY rehearsal {wall:.0f} s; --plan's wall time / scale {plan_wall:.0f} s "
          f"(ratio {plan_wall / wall:.2f})")
    for line in failed[:5]:
        print("  " + line[:200])
    return phases.get("search") or {}


def rehearse(args, address: str, uri: str, studies: str, storage: Path, env: dict,
             plan_wall: float, folder: Path, *extra: str) -> tuple[int, dict]:
    """One rehearsal; its exit status and its search phase."""
    log = folder / f"rehearsal{len(list(folder.glob('rehearsal*.log')))}.log"
    since = time.time()
    code, wall, peak = run_driver(sweep_command(args, address, uri, studies, storage,
                                                "--rehearse", f"{args.scale:g}", *extra), log, env)
    search = report(args, read_runs(uri, since), wall, plan_wall, peak, log)
    if code != 0:
        print(log.read_text()[-3000:], file=sys.stderr)
    return code, {**search, "rehearsal_s": wall}


def summary(slack: int, ordered: dict, free: dict) -> str:
    return (f"SUMMARY deterministic (--draw-slack {slack}) / free-running: search wall "
            f"{ordered['wall_s']:.0f} s / {free['wall_s']:.0f} s = "
            f"{ordered['wall_s'] / free['wall_s']:.2f}; search GPU use "
            f"{100 * ordered['use']:.0f}% / {100 * free['use']:.0f}%; rehearsal "
            f"{ordered['rehearsal_s']:.0f} s / {free['rehearsal_s']:.0f} s = "
            f"{ordered['rehearsal_s'] / free['rehearsal_s']:.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--cpus-per-node", type=int, default=16)
    p.add_argument("--methods", default="all")
    p.add_argument("--datasets", default=None, help="default: all 11")
    p.add_argument("--trials", type=int, default=24)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--scale", type=float, default=200.0)
    p.add_argument("--concurrent-trials", type=int, default=None,
                   help="default: the sweep's (the cluster's trial slots over the datasets)")
    p.add_argument("--against-free-running", action="store_true",
                   help="a second rehearsal with --free-running, and the ratios")
    p.add_argument("--draw-slack", default="0",
                   help="comma-separated: a deterministic rehearsal with each (default 0)")
    p.add_argument("--storage", type=Path, default=None)
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="vacsr-scale-"))
    storage = args.storage or folder / "sweeps"
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)
    servers = Servers(folder)
    cluster, code = None, 1
    try:
        pg = start_postgresql(servers)
        env["PGPASSWORD"] = pg.split(":")[2].split("@")[0]
        mlflow_db = create_database(pg, "mlflow").replace(f":{env['PGPASSWORD']}@", "@")
        studies = create_database(pg, "optuna").replace(f":{env['PGPASSWORD']}@", "@")
        os.environ["PGPASSWORD"] = env["PGPASSWORD"]
        from vacsr.records.database_url import with_driver

        uri, _ = servers.mlflow(with_driver(mlflow_db), log=folder / "mlflow.log")
        cluster = start_cluster(args.nodes, args.gpus_per_node, args.cpus_per_node)
        plan_out = folder / "plan.json"
        code, _, _ = run_driver(sweep_command(args, cluster.address, uri, studies, storage,
                                              "--plan", "--plan-out", str(plan_out)),
                                folder / "plan.log", env)
        if code != 0:
            print((folder / "plan.log").read_text()[-3000:], file=sys.stderr)
            return code
        plan_wall = json.loads(plan_out.read_text())["totals"]["wall_s"] / args.scale
        ordered = {}
        for slack in [int(s) for s in args.draw_slack.split(",")]:
            named = ["--draw-slack", str(slack), "--name", f"base2novel-slack{slack}"] \
                if slack else []
            print(f"deterministic, --draw-slack {slack}:")
            code, ordered[slack] = rehearse(args, cluster.address, uri, studies, storage, env,
                                            plan_wall, folder, *named)
            if code != 0:
                return code
        if not args.against_free_running:
            return code
        print("--free-running, the same cluster and trials at once:")
        code, free = rehearse(args, cluster.address, uri, studies, storage, env, plan_wall,
                              folder, "--free-running", "--name", "base2novel-free")
        for slack, search in ordered.items():
            if code == 0 and free.get("wall_s") and search.get("wall_s"):
                print(summary(slack, search, free))
        return code
    except BaseException:
        code = 1  # its logs are kept
        raise
    finally:
        if cluster is not None:
            cluster.shutdown()
        from tests.support.servers import stop_session

        for process in reversed(servers.started):
            stop_session(process)
        for path in servers.folders:
            shutil.rmtree(path, ignore_errors=True)
        if code == 0:
            shutil.rmtree(folder, ignore_errors=True)
        else:  # what a failure leaves to read: the drivers' logs, the MLflow server's, the sweeps
            print(f"bench_scale: failed; its logs stay in {folder} (the MLflow server's in "
                  "mlflow.log)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
