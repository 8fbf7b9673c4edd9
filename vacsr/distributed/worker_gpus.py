"""Which GPU each Ray Train worker of a run got: `workers.json` in the run's output folder.

One entry per rank (one for a Tune trial actor that trains itself): its node, host and process
id, Ray's GPU ids for it (`ray.get_gpu_ids()`), the CUDA_VISIBLE_DEVICES Ray set in its process,
the device Ray gives it (`ray.train.torch.get_device()` on a Train worker) and the device it
computes on (train.device may keep it on the CPU). A researcher reads from it where a run trained;
the scheduling tests check the packing of trials and workers on GPUs with it.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import ray
import ray.train
import ray.train.torch
import torch.distributed as dist

from vacsr.atomic import atomic_write_json

WORKERS_FILE = "workers.json"


def assigned_device() -> str:
    """The device Ray gives an actor that trains itself, as Ray Train gives a worker its own:
    the reserved GPU (Ray makes it cuda:0 through CUDA_VISIBLE_DEVICES), else the CPU."""
    return "cuda:0" if ray.get_gpu_ids() else "cpu"


def placement_tags() -> dict:
    """Where this process runs (Ray node id and host): which machine trained a run, in MLflow."""
    return {"vacsr.ray_node_id": ray.get_runtime_context().get_node_id(),
            "vacsr.host": socket.gethostname()}


def this_worker(rank: int, device, ray_device: str | None = None) -> dict:
    """This process's placement: a Train worker's (`ray_device` from Ray Train), or a trial
    actor's that trains itself (vacsr/sweep/search/trial_run.py passes the device Ray gave it)."""
    return {"rank": rank, "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(), "pid": os.getpid(),
            "gpu_ids": sorted(str(i) for i in ray.get_gpu_ids()),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ray_device": ray_device or str(ray.train.torch.get_device()), "device": str(device),
            "started_at": time.time()}


def record_workers(output_dir: str | Path, rank: int, world: int, device,
                   ray_device: str | None = None) -> None:
    """Every rank's placement, gathered to rank 0, which writes WORKERS_FILE (atomically)."""
    entry = this_worker(rank, device, ray_device)
    entries = [entry]
    if world > 1 and dist.is_available() and dist.is_initialized():
        entries = [None] * world
        dist.all_gather_object(entries, entry)
    if rank == 0:
        atomic_write_json(Path(output_dir) / WORKERS_FILE, {"workers": entries})


def read_workers(output_dir: str | Path) -> list[dict]:
    """The placements record_workers wrote for a run: one entry per rank."""
    return json.loads((Path(output_dir) / WORKERS_FILE).read_text())["workers"]
