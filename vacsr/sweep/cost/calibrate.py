"""Step costs measured where the trials would run: one Ray task with a trial's resources times the
parts a training step and an evaluation pass are made of, per input, for one model and precision.

    image_forward          s per image: the whole image tower, without autograd
    image_backward_block   s per image and block on the gradient path: (a step with every block
                           training - image_forward) / depth
    text_forward, text_backward_block   the same per prompt
    head_pair              s per (image, prompt) pair: the adapter forward and backward
    image_load             s per image file: decode and the training transform (one process)
    startup                s per dataset: its search's start up to a trial's model built (a
                           trial actor is reused by the next trial), and again for the final runs
    teardown               s per dataset: the search's end after its last trial

vacsr/sweep/cost/estimate.py composes a configuration's step from them (docs/performance.md).
"""
from __future__ import annotations

import copy
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

CALIBRATION_BATCH = 8  # images (and at most as many prompts) per timed pass
WARMUP, REPEATS = 1, 3  # untimed passes, then the median of the timed ones
CALIBRATION_PREFIX = "vacsr-calibration-"  # then the owner's pid: a stale one is cleared
POLL_S = 0.2  # how often a stop signal is looked at while the calibration runs


@dataclass(frozen=True)
class StepCosts:
    device: str  # where it was measured: "cpu, 2 thread(s)" or "cuda: <GPU name>"
    memory_gib: float | None  # the GPU's memory; None on a CPU
    image_forward: float
    image_backward_block: float
    text_forward: float
    text_backward_block: float
    head_pair: float
    image_load: float
    startup: float
    teardown: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def _median_seconds(work: Callable[[], None], sync: Callable[[], None]) -> float:
    times = []
    for index in range(WARMUP + REPEATS):
        start = time.perf_counter()
        work()
        sync()
        if index >= WARMUP:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _tower_costs(encode: Callable, inputs, depth: int, sync) -> tuple[float, float]:
    """(forward s, backward s per block) per input of a tower whose blocks all train."""
    import torch

    def frozen() -> None:
        with torch.no_grad():
            encode(inputs)

    def trained() -> None:
        encode(inputs).float().sum().backward()

    forward = _median_seconds(frozen, sync) / len(inputs)
    step = _median_seconds(trained, sync) / len(inputs)
    return forward, max(step - forward, 0.0) / max(depth, 1)


def _load_seconds(paths: tuple[str, ...], transform) -> float:
    from vacsr.data.base import load_image

    if not paths:  # data rendered in memory (synthetic retrieval): no files to decode
        return 0.0
    start = time.perf_counter()
    for path in paths:
        transform(load_image(path))
    return (time.perf_counter() - start) / len(paths)


def measure_costs(config, samples: tuple[str, ...], submitted: float) -> StepCosts:
    """Time the parts on this process's device; `submitted`: when the search started."""
    import torch

    from vacsr.compute_device import resolve_device
    from vacsr.config import set_value
    from vacsr.methods.build import build_model
    from vacsr.model.prefix import blocks

    config = copy.deepcopy(config)
    for key, value in (("model.pretrained", None), ("model.trainable_image_blocks", -1),
                       ("model.trainable_text_blocks", -1), ("model.trainable_side", "first")):
        set_value(config, key, value)  # random weights time the same; every block trains
    model = build_model(config)
    device = resolve_device(config.train.device)
    model.to(device)
    startup = time.time() - submitted
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    backbone = model.backbone
    size = backbone.clip.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    images = torch.randn(CALIBRATION_BATCH, 3, size, size, device=device)  # (b, 3, S, S)
    tokens = backbone.tokenize(["a photo of a thing."] * CALIBRATION_BATCH).to(device)  # (b, T)
    amp = config.train.amp and (cuda or config.train.amp_on_cpu)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        image = _tower_costs(backbone.encode_image, images, len(blocks(backbone.clip, "image")),
                             sync)
        text = _tower_costs(backbone.encode_text, tokens, len(blocks(backbone.clip, "text")),
                            sync)
    with torch.no_grad():
        feats = backbone.encode_image(images).float(), backbone.encode_text(tokens).float()

    def head_step() -> None:
        out = model.head(*feats)  # (b, b) pairs
        total = sum(t.float().sum() for t in (out.logits, out.sigma_hat, out.mu, out.logvar)
                    if t is not None)
        if total.requires_grad:  # a head with nothing to train (zero-shot CLIP) scores alone
            total.backward()

    head = _median_seconds(head_step, sync) / CALIBRATION_BATCH ** 2
    name = (f"cuda: {torch.cuda.get_device_name(device)}" if cuda
            else f"cpu, {torch.get_num_threads()} thread(s)")
    memory = torch.cuda.get_device_properties(device).total_memory / 2 ** 30 if cuda else None
    return StepCosts(device=name, memory_gib=memory, image_forward=image[0],
                     image_backward_block=image[1], text_forward=text[0],
                     text_backward_block=text[1], head_pair=head,
                     image_load=_load_seconds(samples, backbone.train_transform),
                     startup=startup)


def _calibration_trial(params: dict) -> None:
    """The trial of the calibration's one-trial search: the costs, and when it ended."""
    from ray import tune

    costs = measure_costs(params["config"], params["samples"], params["submitted"])
    tune.report({"costs": costs.as_dict(), "ended": time.time()})


def _calibration_search(config, samples: tuple[str, ...], resources: dict[str, float],
                        folder: str, verbose: bool = False) -> StepCosts:
    """A search of one trial, as a dataset's task runs one (Tuner, trial actor, teardown), in
    `folder` (removed as it ends): the trial measures the costs; the search's start-up up to
    the model's build and its teardown after the trial are the fixed costs of a dataset."""
    from ray import tune

    from vacsr.distributed.cluster import quiet_logging

    quiet_logging(verbose)  # Tune's settings as a dataset's task has them (its loggers too)

    try:
        trainable = tune.with_resources(_calibration_trial, resources)
        params = {"config": config, "samples": samples, "submitted": time.time()}
        tuner = tune.Tuner(trainable, param_space=params,
                           # a name of its own: Ray stages an experiment's files by name
                           # and second on the node (vacsr/sweep/plan/folders.py)
                           run_config=tune.RunConfig(name=f"calibration-{Path(folder).name}",
                                                     storage_path=folder,
                                                     verbose=0))
        result = tuner.fit()[0]
        if result.error is not None:
            raise result.error
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    teardown = time.time() - result.metrics["ended"]
    costs = result.metrics["costs"]
    return StepCosts(**{**costs, "teardown": teardown})


def _owner_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: alive
        return False
    return False


def clear_stale_calibrations(root: str | Path | None = None) -> list[Path]:
    """Remove the calibration folders (`vacsr-calibration-<pid>-*`) that processes killed
    before their clean-up (SIGKILL) left in the temporary folder `root` (default: this
    process's), only those whose owner process is gone. Returns what it removed."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for folder in root.glob(f"{CALIBRATION_PREFIX}*"):
        pid = folder.name[len(CALIBRATION_PREFIX):].partition("-")[0]
        if folder.is_dir() and not folder.is_symlink() and pid.isdigit() \
                and int(pid) != os.getpid() and _owner_gone(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def run_calibration(config, samples: tuple[str, ...], resources: dict[str, float],
                    address: str | None, stop_check: Callable[[], None] = lambda: None,
                    verbose: bool = False) -> tuple[StepCosts, dict]:
    """(costs, the cluster's resources): `_calibration_search` as a Ray task like a dataset's
    (no resources of its own; its trial holds `resources`, one trial's), on the cluster at
    `address` or, without one, a local Ray started and shut down here with this machine's CPUs,
    no dashboard and Ray's output in its log files (unless `verbose`), as a sweep run's. While
    it runs, `stop_check` is called a few times a second: what it raises (a noted SIGINT or
    SIGTERM) stops the task and removes its folder on the way out."""
    import ray

    from vacsr.distributed.cluster import ensure_ray, quiet_logging

    clear_stale_calibrations()
    own = not ray.is_initialized()
    if own:
        quiet_logging(verbose)
        ensure_ray(address=address, log_to_driver=verbose)
    folder = tempfile.mkdtemp(prefix=f"{CALIBRATION_PREFIX}{os.getpid()}-")
    task = None
    try:
        stop_check()  # a stop while Ray started
        task = ray.remote(num_cpus=0, max_retries=0)(_calibration_search).remote(
            config, samples, resources, folder, verbose)
        while not ray.wait([task], timeout=POLL_S)[0]:
            stop_check()
        costs = ray.get(task)
        return costs, dict(ray.cluster_resources())
    except BaseException:
        if task is not None and not own:  # a cluster that stays up: its task ends here
            ray.cancel(task, force=True)
        raise
    finally:
        if own:
            ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
