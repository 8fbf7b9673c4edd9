"""Which end of each tower trains: the cost of a training step, and of a val pass with the frozen
prefix cached (model.trainable_side, vacsr/model/prefix.py, vacsr/model/prefix_cache.py).

    .venv/bin/python benchmarks/bench_trainable_side.py                    # ViT-B/16, one thread
    .venv/bin/python benchmarks/bench_trainable_side.py --device cuda      # the same on a GPU

At real shapes with random weights (nothing is downloaded): ViT-B/16 at 224 px, pooled features
(the few-shot recipe of paper C.2), N = 2 trainable blocks per tower, batch 16 images against
the prompts of 16 classes. Times the trainer's own step (Trainer.compute_loss, backward,
clipping, AdamP) with the first 2 and with the last 2 blocks of each tower training,
interleaved (first, last, first, ...) so that a busy machine slows both alike; then one val pass
over --images image files with the last 2 training: cold (prefix computed and stored) and warm
(read from the cache). CPU-seconds are the process's (user + system); on the CPU the run uses
--threads intra-op threads. Prints medians and the ratios last / first and warm / cold.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vacsr.config import load_config  # noqa: E402
from vacsr.model.encoding import encode_images  # noqa: E402
from vacsr.model.prefix_cache import PrefixCache  # noqa: E402
from vacsr.threads import torch_threads  # noqa: E402
from vacsr.train.loop import Trainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_train_step import train_step as step  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-B-16")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=2, help="trainable blocks per tower")
    parser.add_argument("--images", type=int, default=256, help="val pass: image files")
    parser.add_argument("--steps", type=int, default=2, help="measured steps per side")
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    return parser.parse_args(argv)


def trainer(args, side: str) -> Trainer:
    return Trainer(load_config(overrides=[
        f"model.name={args.model}", "model.use_gpo=false", f"model.trainable_side={side}",
        f"model.trainable_image_blocks={args.blocks}", f"model.trainable_text_blocks={args.blocks}",
        "data.task=classification", "data.shots=1", f"train.batch_size={args.batch_size}",
        f"train.device={args.device}", "train.progress=false"]))


class Clock:
    """Wall and CPU seconds of a block (CUDA work waited for)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def __enter__(self) -> "Clock":
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def step_costs(args, runs: dict[str, Trainer]) -> dict[str, tuple[float, float]]:
    """side -> (median CPU-s, median wall-s) of a training step."""
    size = runs["first"].model.backbone.clip.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    images = torch.randn(args.batch_size, 3, size, size, device=args.device)
    labels = torch.arange(args.batch_size, device=args.device) % len(
        runs["first"].splits["train"].classnames)
    for run in runs.values():  # warm-up: AdamP's state, the prompts' frozen part
        step(run, [images, labels], 0)
    measured = {side: [] for side in runs}
    for seed in range(1, args.steps + 1):
        for side, run in runs.items():
            with Clock(args.device) as clock:
                step(run, [images, labels], seed)
            measured[side].append((clock.cpu, clock.wall))
    return {side: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
            for side, v in measured.items()}


def val_costs(args, run: Trainer, folder: Path) -> tuple[Clock, Clock, float]:
    """Cold and warm val passes over --images files with the cache; the largest feature gap."""
    paths = []
    for i in range(args.images):  # 256 px photos-to-be: the eval transform resizes them
        path = folder / "images" / f"{i:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(i)
        Image.fromarray((torch.rand(256, 256, 3) * 255).byte().numpy()).save(path)
        paths.append(str(path))
    backbone = run.model.backbone
    features = []
    clocks = []
    for _ in range(2):
        cache = PrefixCache(folder / "cache", budget_gib=16)
        with Clock(args.device) as clock:
            features.append(encode_images(backbone, paths, batch_size=64, cache=cache))
        clocks.append(clock)
    assert cache.stats.served == args.images, cache.stats
    return clocks[0], clocks[1], float((features[0] - features[1]).abs().max())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_trainable_side: --device cuda needs CUDA; nothing measured")
        return 0
    with torch_threads(args.threads if args.device == "cpu" else torch.get_num_threads()):
        runs = {side: trainer(args, side) for side in ("first", "last")}
        steps = step_costs(args, runs)
        with tempfile.TemporaryDirectory(prefix="vacsr-bench-side-") as tmp:
            cold, warm, gap = val_costs(args, runs["last"], Path(tmp))
    where = f"{args.threads} thread(s)" if args.device == "cpu" else "cuda"
    print(f"{args.model}, batch {args.batch_size}, {args.blocks} trainable blocks per tower, "
          f"{where}:")
    for side, (cpu, wall) in steps.items():
        print(f"  train step, {side} {args.blocks}: {cpu:.2f} CPU-s ({wall:.2f} s wall)")
    print(f"  val pass over {args.images} images, cache cold: {cold.cpu:.2f} CPU-s "
          f"({cold.wall:.2f} s wall); warm: {warm.cpu:.2f} CPU-s ({warm.wall:.2f} s wall); "
          f"largest feature difference {gap:.1e}")
    step_ratio = steps["last"][0] / steps["first"][0]
    val_ratio = warm.cpu / cold.cpu
    print(f"SUMMARY last/first step {step_ratio:.2f}x (target <= 0.45), warm/cold val pass "
          f"{val_ratio:.2f}x (target <= 0.30)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
