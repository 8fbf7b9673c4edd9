"""The evaluation actors (EvalPool) against the in-process chunked scorer, measured in one run.

    .venv/bin/python benchmarks/bench_eval_actors.py             # 1,000 x 5,000 pairs, CPU
    .venv/bin/python benchmarks/bench_eval_actors.py --images 5000 --captions 25000   # COCO 5K

Scores one retrieval problem (the paper's adapter sizes: d 512, H 512, L 32, K 2) three ways: in
process, on 1 actor and on `--actors` actors (queries sharded, top-k lists merged), checks that
every top-k list and metric is identical, and prints the times and the speed-up of N actors over
one as a ratio. On a GPU machine each actor holds one GPU.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vacsr.eval.evaluate import evaluate_retrieval  # noqa: E402
from vacsr.model.adapter import VariationalSimilarityAdapter  # noqa: E402


def problem(images: int, captions: int, dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    image_feats = F.normalize(torch.randn(images, dim, generator=gen), dim=1)
    caption_to_image = torch.arange(captions) % images
    noise = 0.5 * torch.randn(captions, dim, generator=gen)
    text_feats = F.normalize(image_feats[caption_to_image] + noise, dim=1)
    torch.manual_seed(seed)
    return image_feats, text_feats, caption_to_image, VariationalSimilarityAdapter(embed_dim=dim)


def timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--captions", type=int, default=5000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    import ray

    from vacsr.distributed.cluster import ensure_ray, quiet_logging
    from vacsr.distributed.eval_actor import EvalPool

    quiet_logging()
    gpus = torch.cuda.device_count()
    ensure_ray(num_cpus=os.cpu_count(), num_gpus=gpus, log_to_driver=False)
    images, texts, c2i, head = problem(args.images, args.captions, args.dim)
    head = head.eval()
    score = lambda scorer=None: evaluate_retrieval(images, texts, head, c2i, scorer=scorer)  # noqa
    rows = [("in-process ChunkedScorer", *timed(score, args.repeats))]
    cpus = max(1.0, (os.cpu_count() or 1) / args.actors) if not gpus else 1.0
    for actors in (1, args.actors):
        pool = EvalPool(head, texts, num_actors=actors, num_cpus_per_actor=cpus)
        pool.describe()  # started and holding the items before timing
        rows.append((f"EvalPool, {actors} actor(s)", *timed(lambda: score(pool), args.repeats)))
        pool.shutdown()
    reference = {k: v for k, v in rows[0][2].items() if k != "eval_seconds"}
    for name, _, metrics in rows[1:]:
        got = {k: v for k, v in metrics.items() if k != "eval_seconds"}
        assert got == reference, f"{name}: metrics differ from the in-process scorer"
    pairs = args.images * args.captions
    device = f"{gpus} GPU(s)" if gpus else f"{os.cpu_count()} CPU core(s)"
    print(f"{args.images} x {args.captions} = {pairs:,} pairs, d {args.dim}, on {device}")
    print(f"{'scorer':<28}{'seconds':>10}{'Mpairs/s':>10}")
    for name, seconds, _ in rows:
        print(f"{name:<28}{seconds:>10.2f}{pairs / seconds / 1e6:>10.2f}")
    print(f"metrics identical on all three: yes (R@1 i2t {reference['i2t_r1']:.2f})")
    print(f"{args.actors} actors vs 1 actor: {rows[1][1] / rows[2][1]:.2f}x faster; "
          f"1 actor vs in-process: {rows[0][1] / rows[1][1]:.2f}x")
    ray.shutdown()


if __name__ == "__main__":
    main()
