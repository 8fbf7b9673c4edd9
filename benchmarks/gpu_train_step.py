"""One bf16 training step at the paper's scale on a GPU: time and peak memory against the estimate.

    .venv/bin/python benchmarks/gpu_train_step.py [--model ViT-B-16] [--batch-size 128]
    .venv/bin/python benchmarks/gpu_train_step.py --device cpu --model vacsr-tiny --batch-size 8

`--device cpu` (gpu_check.sh's dry run) runs the same step through the same bf16 path on the CPU
(train.amp_on_cpu): time and losses; peak memory is CUDA's allocator statistic and is not measured.

Random weights (nothing is downloaded): speed and memory do not depend on the weights' values. The
step is the trainer's own (Trainer.compute_loss: backbone under bf16 autocast with GPO over every
token, adapter and loss in fp32; backward, gradient clipping, AdamP), on a batch of B random images
and B synthetic captions. The first steps allocate AdamP's state; the peak is measured over the
steps after them, with torch.cuda.max_memory_allocated, and compared with
vacsr.model.memory.estimate_for_config (arXiv 2605.30968 trains ViT-B/16 at batch 128).
The last line, `SUMMARY ...`, is the figure benchmarks/gpu_check.sh reports.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vacsr.config import load_config  # noqa: E402
from vacsr.model.memory import estimate_for_config  # noqa: E402
from vacsr.train.loop import Trainer  # noqa: E402

GIB = 2**30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-B-16")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: the dry run of the same step (bf16 autocast on the CPU)")
    parser.add_argument("--warmup", type=int, default=2, help="steps before measuring")
    parser.add_argument("--steps", type=int, default=3, help="measured steps")
    parser.add_argument("--tolerance", type=float, default=0.25,
                        help="relative gap between measured peak and estimate called a match")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config override (e.g. model.trainable_image_blocks=2)")
    return parser.parse_args(argv)


def make_batch(trainer: Trainer, batch_size: int) -> list[torch.Tensor]:
    """B random 224 px images (already normalised) and B captions of the synthetic data."""
    captions = trainer.splits["train"].captions
    texts = [captions[i % len(captions)] for i in range(batch_size)]
    size = trainer.model.backbone.clip.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else size
    images = torch.randn(batch_size, 3, size, size)
    tokens = trainer.model.backbone.tokenize(texts)
    return [t.to(trainer.device) for t in (images, tokens, torch.arange(batch_size))]


def train_step(trainer: Trainer, batch: list[torch.Tensor], seed: int) -> float:
    """The body of Trainer.train_epoch for one batch; returns the loss."""
    loss, _ = trainer.compute_loss(batch, None, seed)
    trainer.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.config.optim.grad_clip)
    trainer.optimizer.step()
    return loss.item()


def measure(trainer: Trainer, batch: list[torch.Tensor], warmup: int,
            steps: int) -> tuple[list[float], list[float], int | None]:
    """(step seconds, losses, peak bytes or None on the CPU) of `steps` steps after `warmup`."""
    cuda = trainer.device.type == "cuda"
    losses = [train_step(trainer, batch, seed) for seed in range(warmup)]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for seed in range(warmup, warmup + steps):
        start = time.perf_counter()
        losses.append(train_step(trainer, batch, seed))  # .item() waits for the GPU
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds, losses, torch.cuda.max_memory_allocated() if cuda else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_train_step: needs CUDA (torch.cuda.is_available() is False); nothing measured")
        return 0
    config = load_config(overrides=[
        f"model.name={args.model}", f"train.batch_size={args.batch_size}", "train.amp=true",
        "train.amp_on_cpu=true", f"train.device={args.device}", "data.num_train=16",
        "data.num_test=8", "train.progress=false", *args.set])
    trainer = Trainer(config)
    assert trainer.precision.name == "bf16", trainer.precision
    batch = make_batch(trainer, args.batch_size)
    seconds, losses, peak = measure(trainer, batch, args.warmup, args.steps)
    step = statistics.median(seconds)
    finite = all(math.isfinite(x) for x in losses)
    if peak is None:
        print(f"SUMMARY {args.model} batch {args.batch_size} bf16 on cpu (dry run): "
              f"{step:.3f} s/step, losses " + ", ".join(f"{x:.4f}" for x in losses)
              + f", {'finite' if finite else 'NON-FINITE'}; peak memory needs CUDA")
        return 0 if finite else 1
    estimate = estimate_for_config(config)
    for name, value in estimate.items():
        print(f"  estimate {name:<12} {value / GIB:8.2f} GiB")
    ratio = peak / estimate["total"]
    match = abs(ratio - 1) <= args.tolerance
    print(f"  measured peak allocated {peak / GIB:.2f} GiB; step times "
          + ", ".join(f"{s:.3f}" for s in seconds) + " s; losses "
          + ", ".join(f"{x:.4f}" for x in losses))
    print(f"SUMMARY {args.model} batch {args.batch_size} bf16: {step:.3f} s/step "
          f"({args.batch_size / step:.0f} image-caption pairs/s), peak {peak / GIB:.2f} GiB vs "
          f"estimate {estimate['total'] / GIB:.2f} GiB ({ratio:.2f}x, "
          f"{'within' if match else 'OUTSIDE'} {args.tolerance:.0%}), loss "
          f"{'finite' if finite else 'NON-FINITE'}")
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
