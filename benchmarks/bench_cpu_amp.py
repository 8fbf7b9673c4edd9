"""bf16 autocast on the CPU against fp32: why `train.amp_on_cpu` is off by default.

    .venv/bin/python benchmarks/bench_cpu_amp.py [--model vacsr-tiny] [--batch-size 32]

Times the trainer's own step (Trainer.compute_loss, backward, clipping, AdamP; GPO over every
token, as the retrieval recipe of paper C.2 trains) and the chunked scorer's exact walk over
--images x 5 captions, each in fp32 and in bf16, interleaved in one run (fp32, bf16, fp32, ...)
so that a machine shared with other work slows both alike; prints the median of each and the
ratio bf16 / fp32.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vacsr.config import load_config  # noqa: E402
from vacsr.eval.scorer import ChunkedScorer  # noqa: E402
from vacsr.model.adapter import VariationalSimilarityAdapter  # noqa: E402
from vacsr.train.loop import Trainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_train_step import make_batch, train_step  # noqa: E402


def trainers(model: str, batch_size: int) -> dict[str, Trainer]:
    common = [f"model.name={model}", f"train.batch_size={batch_size}", "train.device=cpu",
              "data.num_train=16", "data.num_test=8", "train.progress=false"]
    return {name: Trainer(load_config(overrides=common + [f"train.amp_on_cpu={on}"]))
            for name, on in (("fp32", "false"), ("bf16", "true"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vacsr-tiny")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--images", type=int, default=100, help="scorer: images (5 captions each)")
    args = parser.parse_args(argv)
    runs = trainers(args.model, args.batch_size)
    batches = {name: make_batch(t, args.batch_size) for name, t in runs.items()}
    head = VariationalSimilarityAdapter(embed_dim=512).eval()
    images = F.normalize(torch.randn(args.images, 512), dim=1)
    captions = F.normalize(torch.randn(5 * args.images, 512), dim=1)
    scorers = {name: ChunkedScorer(head, device="cpu", precision=name) for name in runs}
    for name in runs:  # warm-up: AdamP state, kernels, the scorer's workspace
        train_step(runs[name], batches[name], 0)
        scorers[name].score(images, captions, k=10)
    step = {name: [] for name in runs}
    score = {name: [] for name in runs}
    for round_ in range(args.rounds):
        for name in runs:
            start = time.perf_counter()
            train_step(runs[name], batches[name], round_ + 1)
            step[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            scorers[name].score(images, captions, k=10)
            score[name].append(time.perf_counter() - start)
    median = {k: {n: statistics.median(v) for n, v in d.items()}
              for k, d in (("step", step), ("score", score))}
    print(f"{args.model} batch {args.batch_size}, {torch.get_num_threads()} threads: train step "
          f"fp32 {median['step']['fp32']:.3f} s, bf16 {median['step']['bf16']:.3f} s "
          f"({median['step']['bf16'] / median['step']['fp32']:.2f}x); scorer "
          f"{args.images} x {5 * args.images} pairs fp32 {median['score']['fp32']:.3f} s, bf16 "
          f"{median['score']['bf16']:.3f} s "
          f"({median['score']['bf16'] / median['score']['fp32']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
