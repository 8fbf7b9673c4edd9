"""Connecting to Ray: the cluster named by RAY_ADDRESS (`ray job submit` sets it), else a local one."""
from __future__ import annotations

import os

import ray


def ensure_ray(num_cpus: int | None = None, num_gpus: int | None = None,
               include_dashboard: bool = True, address: str | None = None) -> None:
    """ray.init once. With `address` (or RAY_ADDRESS, which `ray job submit` sets) join that
    cluster; otherwise start a local instance with explicit resources (the dashboard stays on:
    Train/Tune use its state API) on loopback."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    # one machine is never preempted: skip Ray Train's per-run preemption-watcher actor
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    ray.init(num_cpus=num_cpus or os.cpu_count() or 1, num_gpus=num_gpus,
             include_dashboard=include_dashboard, dashboard_host="127.0.0.1",
             log_to_driver=True)
