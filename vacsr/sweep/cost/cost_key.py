"""What measured step costs depend on, as the key they are kept under (cost_store.py): the
settings a calibrated step reads (the model, its head and so its weights' shapes, the device and
precision), the calibration's batch and repeats, one trial's resources and threads, where the
trials run (this machine's CPU model, CPU count and, for GPU trials, GPUs; a cluster's live node
shapes), the image files' format and size the loading cost decodes, a digest of the source of the
code a calibrated step runs, and the torch, open_clip and Python versions.

Nothing here imports torch or open_clip for a CPU sweep: versions and source are read from the
installed files, so a key costs milliseconds.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from vacsr.config import flatten
from vacsr.model.pretrained_cache import sha256_of
from vacsr.sweep.cost.calibrate import CALIBRATION_BATCH, REPEATS, WARMUP

# the config keys a calibrated step reads (calibrate.measure_costs builds the model from
# model.* and adapter.*, places it by train.device, autocasts by train.amp*); the keys it sets
# itself are left out: the costs do not depend on them
STEP_SECTIONS = ("model.", "adapter.")
STEP_KEYS = ("train.device", "train.amp", "train.amp_on_cpu")
SET_BY_CALIBRATION = ("model.pretrained", "model.trainable_image_blocks",
                      "model.trainable_text_blocks", "model.trainable_side")
# the code a calibrated step runs, relative to the vacsr package (a folder: its .py and .json
# files): the model stack and its configs, image loading, the device choice, the timing itself
STEP_CODE = ("model", "data/base.py", "compute_device.py", "sweep/cost/calibrate.py")


def step_settings(config) -> dict[str, Any]:
    flat = flatten(config)
    return {key: flat[key] for key in sorted(flat)
            if (key.startswith(STEP_SECTIONS) or key in STEP_KEYS)
            and key not in SET_BY_CALIBRATION}


def step_code_files(root: Path | None = None) -> list[Path]:
    """The files of STEP_CODE under the vacsr package folder `root` (found without importing)."""
    root = root or Path(find_spec("vacsr").origin).parent
    files: list[Path] = []
    for part in STEP_CODE:
        path = root / part
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix in (".py", ".json"))
        else:
            files.append(path)
    return files


def code_digest(root: Path | None = None) -> str:
    root = root or Path(find_spec("vacsr").origin).parent
    digest = hashlib.sha256()
    for path in step_code_files(root):
        digest.update(f"{path.relative_to(root)}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def versions() -> dict[str, str]:
    """The libraries whose kernels time the step: torch (with its build tag), open_clip."""
    torch_build = Path(find_spec("torch").submodule_search_locations[0]) / "version.py"
    return {"torch": version("torch"), "torch_build": sha256_of(torch_build),
            "open_clip": version("open_clip_torch"), "python": platform.python_version()}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    import torch

    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def machine(gpus: bool) -> dict[str, Any]:
    """This machine as the local Ray instance's trials see it."""
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "gpus": gpu_names() if gpus else []}


def cluster_nodes() -> list[dict[str, Any]]:
    """The shapes of the joined cluster's live nodes (CPUs, GPUs, accelerator types): a cluster
    that changed shape is measured again."""
    import ray

    shapes = set()
    for node in ray.nodes():
        if node.get("Alive"):
            held = node.get("Resources", {})
            shapes.add(json.dumps({"CPU": held.get("CPU", 0), "GPU": held.get("GPU", 0),
                                   "accelerators": sorted(k for k in held
                                                          if k.startswith("accelerator_type:"))},
                                  sort_keys=True))
    return [json.loads(shape) for shape in sorted(shapes)]


def sample_shapes(samples: tuple[str, ...]) -> list[list]:
    """Format and size of each image file the loading cost decodes (from its header)."""
    from PIL import Image

    shapes = []
    for path in samples:
        try:
            with Image.open(path) as image:
                shapes.append([image.format, *image.size])
        except OSError:  # the calibration says what is wrong with it
            shapes.append([Path(path).suffix, "unreadable"])
    return shapes


def cost_key(config, samples: tuple[str, ...], resources: dict[str, float],
             address: str | None) -> dict[str, Any]:
    """The key of the costs of `config`'s step measured with `resources` per trial, on the
    cluster at `address` (joined) or, without one, on this machine."""
    where = ({"cluster": cluster_nodes()} if address
             else {"machine": machine(resources.get("GPU", 0) > 0)})
    key = {"step": step_settings(config),
           "calibration": {"batch": CALIBRATION_BATCH, "warmup": WARMUP, "repeats": REPEATS},
           "trial_resources": resources, "threads": os.environ.get("OMP_NUM_THREADS"),
           "where": where, "samples": sample_shapes(samples), "code": code_digest(),
           "versions": versions()}
    return json.loads(json.dumps(key, sort_keys=True, default=str))  # as it reads back


def key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def changed_parts(kept: dict[str, Any], key: dict[str, Any]) -> list[str]:
    """The parts of `kept` that differ from `key` (a step's settings by name)."""
    parts = []
    for part in sorted(set(kept) | set(key)):
        if kept.get(part) == key.get(part):
            continue
        if part == "step" and isinstance(kept.get(part), dict):
            old, new = kept[part], key.get(part, {})
            names = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            parts.append(f"step ({', '.join(names)})")
        else:
            parts.append(part)
    return parts
