"""COCO-5K exact adapter scoring on one GPU, against that GPU's measured bf16 matmul rate.

    .venv/bin/python benchmarks/gpu_scorer.py [--target-s 5] [--budget-mib 256]

benchmarks/bench_scorer.py measures the chunked scorer on the CPU (its GEMM reference is fp32 and
its device is fixed); this is its GPU counterpart at the evaluation's real size: every pair of the
5,000 COCO test images and their 25,000 captions scored by the variational adapter (paper sizes,
arXiv 2605.30968: d = 512, H = 512, L = 32, K = 2), top-k kept both ways, in the bf16 GEMMs
ChunkedScorer uses on CUDA, with the memory budget evaluation uses. A second walk adds the COCO 1K
fold groups, as evaluation of the 5K test split runs it. Target: under 5 s on one H200-class GPU.
The last line, `SUMMARY ...`, is the figure benchmarks/gpu_check.sh reports. `--device cpu`
(gpu_check.sh's dry run, at small sizes) walks the same bf16 path on the CPU.
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

from vacsr.eval.metrics import fold_groups  # noqa: E402
from vacsr.eval.scorer import ChunkedScorer  # noqa: E402
from vacsr.model.adapter import VariationalSimilarityAdapter  # noqa: E402

MIB = 2**20


def bf16_matmul_rate(size: int = 8192, repeats: int = 10, device: str = "cuda") -> float:
    """Best-of dense bf16 GEMM rate (TFLOP/s) of a (size x size) @ (size x size) product."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    out = torch.empty(size, size, device=device, dtype=torch.bfloat16)
    torch.mm(a, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best / 1e12


def timed_walks(scorer: ChunkedScorer, images: torch.Tensor, captions: torch.Tensor,
                repeats: int, groups: tuple[torch.Tensor, ...] | None = None) -> list[float]:
    """Seconds of `repeats` whole walks (each ends with a device synchronisation), after one
    untimed walk that loads kernels and fills the scorer's workspace and the allocator's cache."""
    kwargs = {} if groups is None else {"query_groups": groups[0], "item_groups": groups[1]}
    scorer.score(images, captions, k=10, **kwargs)
    return [scorer.score(images, captions, k=10, **kwargs).stats["seconds"]
            for _ in range(repeats)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--captions-per-image", type=int, default=5)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--budget-mib", type=int, default=256, help="scorer memory budget "
                        "(256: evaluation's default)")
    parser.add_argument("--large-budget-mib", type=int, default=4096,
                        help="a second, untargeted walk with a budget a GPU can spare")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target-s", type=float, default=5.0)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: the dry run (bf16 GEMMs on the CPU; set small --images)")
    parser.add_argument("--matmul-size", type=int, default=8192)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_scorer: needs CUDA (torch.cuda.is_available() is False); nothing measured")
        return 0
    torch.manual_seed(0)
    head = VariationalSimilarityAdapter(embed_dim=args.dim).eval()
    captions_n = args.images * args.captions_per_image
    gen = torch.Generator().manual_seed(1)
    images = F.normalize(torch.randn(args.images, args.dim, generator=gen), dim=1).to(device)
    captions = F.normalize(torch.randn(captions_n, args.dim, generator=gen), dim=1).to(device)
    rate = bf16_matmul_rate(args.matmul_size, device=device)
    # bf16 GEMMs, as evaluation of a bf16 run scores (precision "auto" on CUDA)
    scorer = ChunkedScorer(head, device=device, precision="bf16",
                           memory_budget_bytes=args.budget_mib * MIB)
    plain = statistics.median(timed_walks(scorer, images, captions, args.repeats))
    folds = fold_groups(torch.arange(args.images).repeat_interleave(args.captions_per_image),
                        args.images, 5)
    grouped = statistics.median(timed_walks(scorer, images, captions, args.repeats, folds))
    large = ChunkedScorer(head, device=device, precision="bf16",
                          memory_budget_bytes=args.large_budget_mib * MIB)
    large_s = statistics.median(timed_walks(large, images, captions, args.repeats))
    pairs = args.images * captions_n
    achieved = pairs * head.flops_per_pair() / plain / 1e12
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"
    print(f"  {name}: bf16 matmul {rate:.3g} TFLOP/s ({args.matmul_size}^3, best of 10)")
    print(f"  {args.images} x {captions_n} = {pairs:,} pairs, block "
          f"{scorer.plan(args.images, captions_n)}, budget {args.budget_mib} MiB: {plain:.2f} s "
          f"({pairs / plain:,.0f} pairs/s, "
          f"{achieved:.0f} TFLOP/s = {achieved / rate:.2f} of the matmul rate); with COCO 1K "
          f"fold groups {grouped:.2f} s")
    print(f"  budget {args.large_budget_mib} MiB, block {large.plan(args.images, captions_n)}: "
          f"{large_s:.2f} s")
    verdict = "PASS" if max(plain, grouped) < args.target_s else "FAIL"
    print(f"SUMMARY {verdict}: COCO-5K exact scoring {plain:.2f} s (with 1K folds {grouped:.2f} s),"
          f" target < {args.target_s:g} s; {achieved / rate:.2f} of bf16 matmul {rate:.3g} TFLOP/s"
          + ("" if device == "cuda" else f"; {args.images} images on the cpu (dry run)"))
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
