"""Benchmark of the evaluation engine's chunked scorer, measured in one run on this machine.

    .venv/bin/python benchmarks/bench_scorer.py            # default sizes, a few minutes on 2 CPUs
    .venv/bin/python benchmarks/bench_scorer.py --quick    # smaller sizes, a smoke run

Prints: (1) the machine's dense fp32 GEMM rate, (2) the exact scorer's pairs/s and FLOP rate
(flops_per_pair) and its ratio to that GEMM rate, (3) time and peak memory against the naive scorer
that expands (queries x items x d) Hadamard blocks, (4) peak memory at two problem sizes against
the budget, (5) the two-stage mode's speed-up and R@1 agreement on a synthetic COCO-1K problem.
Peak memory is measured in fresh subprocesses: VmHWM after resetting it (clear_refs) once inputs,
weights and libraries are loaded, i.e. the scorer's own working memory plus its outputs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vacsr.eval.metrics import coco_recalls, retrieval_metrics  # noqa: E402
from vacsr.eval.scorer import ChunkedScorer, naive_score  # noqa: E402
from vacsr.eval.two_stage import topk_agreement, two_stage_score  # noqa: E402
from vacsr.model.adapter import VariationalSimilarityAdapter  # noqa: E402

MIB = 2**20


# ---------------------------------------------------------------- helpers
def make_head(dim: int, seed: int = 0) -> VariationalSimilarityAdapter:
    torch.manual_seed(seed)
    # paper sizes: H=512, L=32, K=2, Dh=64
    return VariationalSimilarityAdapter(embed_dim=dim).eval()


def random_features(n: int, dim: int, seed: int) -> torch.Tensor:
    return F.normalize(torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)), dim=1)


def gemm_rate(shape=(8208, 513, 2048), repeats: int = 5) -> float:
    """Best-of dense fp32 GEMM rate (GFLOP/s) of an (m x k) @ (k x n) product."""
    m, k, n = shape
    a, b, out = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
    torch.mm(a, b, out=out)
    best = min(_timed(lambda: torch.mm(a, b, out=out)) for _ in range(repeats))
    return 2 * m * k * n / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def machine_rate() -> float:
    """The reference: the best of a square GEMM and one of the scorer's first-layer shape."""
    return max(gemm_rate((2048, 2048, 2048), 3), gemm_rate((8208, 513, 2048)))


# ---------------------------------------------------------------- peak memory (child process)
def _status(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", text).group(1)) * 1024


def child_memory(args) -> None:
    """Run one scorer call in this fresh process for at most args.seconds; print peak RSS JSON."""
    head = make_head(args.dim)
    queries, items = random_features(args.nq, args.dim, 1), random_features(args.ng, args.dim, 2)
    if args.impl == "ours":
        scorer = ChunkedScorer(head, device="cpu", memory_budget_bytes=args.budget)
        scorer.score(queries[:2], items[:64], k=args.k)  # load kernels and thread pools first
        call = lambda: scorer.score(queries, items, k=args.k)  # noqa: E731
        modelled = scorer.block_bytes(*scorer.plan(args.nq, args.ng))
    else:
        with torch.no_grad():
            naive_score(head, queries[:2], items[:64])
        call = lambda: torch.no_grad()(naive_score)(head, queries, items, args.query_chunk)  # noqa: E731
        modelled = 0
    baseline = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current RSS
    done = threading.Event()
    start = time.perf_counter()
    threading.Thread(target=lambda: (call(), done.set()), daemon=True).start()
    finished = done.wait(args.seconds)
    elapsed = time.perf_counter() - start
    print(json.dumps({"peak_bytes": _status("VmHWM") - baseline, "finished": finished,
                      "seconds": elapsed, "modelled_block_bytes": modelled}), flush=True)
    os._exit(0)  # do not wait for a scoring thread that is still running


def measure_memory(impl: str, nq: int, ng: int, dim: int, budget: int, seconds: float,
                   query_chunk: int | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child-memory", "--impl", impl, "--nq", str(nq),
           "--ng", str(ng), "--dim", str(dim), "--budget", str(budget), "--seconds", str(seconds)]
    if query_chunk:
        cmd += ["--query-chunk", str(query_chunk)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- sections
def section_rate(head, nq: int, ng: int, dim: int, slices: int, budget: int) -> None:
    """Pairs/s and the FLOP-rate ratio. Other jobs share this machine and its GEMM rate moves by 2x
    within seconds, so the scorer runs in short slices, each bracketed by GEMM measurements, and
    each slice is compared with its own brackets (the larger one, to be conservative)."""
    flops = head.flops_per_pair()
    scorer = ChunkedScorer(head, device="cpu", memory_budget_bytes=budget)
    queries, items = random_features(nq * slices, dim, 3), random_features(ng, dim, 4)
    scorer.score(queries[:8], items, k=10)  # warm-up
    ratios, pairs, seconds = [], 0, 0.0
    for index in range(slices):
        before = gemm_rate(repeats=2)
        stats = scorer.score(queries[index * nq:(index + 1) * nq], items, k=10).stats
        after = gemm_rate(repeats=2)
        pairs, seconds = pairs + stats["pairs"], seconds + stats["seconds"]
        rate = stats["pairs_per_second"] * flops / 1e9
        ratios.append(rate / max(before, after))
        print(f"  slice {index}: {stats['pairs_per_second']:,.0f} pairs/s = {rate:.1f} GFLOP/s; "
              f"GEMM before {before:.1f}, after {after:.1f} GFLOP/s -> ratio {ratios[-1]:.3f}")
    print(f"  => {torch.get_num_threads()} thread(s): {nq * slices} x {ng} pairs in {slices} "
          f"slices, block {stats['block']}: {pairs / seconds:,.0f} pairs/s overall; FLOP-rate / "
          f"matmul-rate median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max "
          f"{max(ratios):.3f}); flops/pair = {flops:,} (flops_per_pair)")


def section_naive(head, dim: int, nq: int, ng: int, budget: int) -> None:
    """Same problem, ours vs naive: time in this process, peak memory in fresh ones."""
    queries, items = random_features(nq, dim, 5), random_features(ng, dim, 6)
    scorer = ChunkedScorer(head, device="cpu", memory_budget_bytes=budget)
    scorer.score(queries[:4], items, k=10)
    ours = _timed(lambda: scorer.score(queries, items, k=10))
    with torch.no_grad():
        naive_score(head, queries[:2], items[:8])
        naive = _timed(lambda: naive_score(head, queries, items))
    ours_mem = measure_memory("ours", nq, ng, dim, budget, 120)
    naive_mem = measure_memory("naive", nq, ng, dim, budget, 120)
    print(f"  {nq} x {ng} (naive expands all {nq * ng * dim * 4 / MIB:,.0f} MiB of s at once): "
          f"chunked {ours:.2f} s, peak {ours_mem['peak_bytes'] / MIB:,.0f} MiB | naive "
          f"{naive:.2f} s, peak {naive_mem['peak_bytes'] / MIB:,.0f} MiB -> "
          f"{naive / ours:.2f}x time, "
          f"{naive_mem['peak_bytes'] / max(ours_mem['peak_bytes'], 1):.1f}x memory")


def section_memory(dim: int, sizes, budget: int, seconds: float, naive_chunk: int) -> None:
    """Peak working memory at two sizes: ours against the budget, naive in query chunks."""
    for nq, ng in sizes:
        ours = measure_memory("ours", nq, ng, dim, budget, seconds)
        naive = measure_memory("naive", nq, ng, dim, budget, seconds, query_chunk=naive_chunk)
        note = "whole call" if ours["finished"] else f"first {seconds:.0f} s of the call"
        print(f"  {nq:>5} x {ng:<6}: chunked peak {ours['peak_bytes'] / MIB:7.1f} MiB "
              f"(budget {budget / MIB:.0f} MiB, modelled block "
              f"{ours['modelled_block_bytes'] / MIB:.1f} MiB; {note}) | naive, {naive_chunk} "
              f"queries x all items per block: "
              f"{naive['peak_bytes'] / MIB:7.1f} MiB | naive whole-matrix expansion would need "
              f"{nq * ng * dim * 4 / 2**30:,.1f} GiB for s alone")


# ---------------------------------------------------------------- two-stage on a synthetic COCO 1K
def synthetic_pairs(num_images: int, dim: int, gen: torch.Generator, noise: float):
    """Images v ~ N(0, I); 5 captions each, t = v + noise, the noise 2x larger on half of the
    dimensions (so a learned weighting beats plain cosine, as a trained adapter should)."""
    scale = torch.ones(dim)
    scale[dim // 2:] = 2.0
    images = torch.randn(num_images, dim, generator=gen)
    captions = images.repeat_interleave(5, 0) + noise * scale * torch.randn(num_images * 5, dim,
                                                                           generator=gen)
    return F.normalize(images, dim=1), F.normalize(captions, dim=1)


def train_adapter(dim: int, steps: int, noise: float,
                  seed: int = 0) -> VariationalSimilarityAdapter:
    """A briefly trained adapter (in-batch BCE on fresh synthetic batches): an untrained one ranks
    at random, which would make any agreement figure meaningless."""
    gen = torch.Generator().manual_seed(seed + 100)
    head = make_head(dim, seed).train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)
    labels = (torch.arange(32)[:, None] == torch.arange(160)[None, :] // 5).float()  # (32, 160)
    for _ in range(steps):
        images, captions = synthetic_pairs(32, dim, gen, noise)
        logits = head(images, captions, sample=False).logits
        loss = F.binary_cross_entropy_with_logits(logits, labels, pos_weight=torch.tensor(20.0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


def section_two_stage(dim: int, num_images: int, k_prime: int, steps: int, noise: float,
                      budget: int) -> None:
    head = train_adapter(dim, steps, noise)
    images, captions = synthetic_pairs(num_images, dim, torch.Generator().manual_seed(7), noise)
    caption_to_image = torch.arange(num_images).repeat_interleave(5)
    scorer = ChunkedScorer(head, device="cpu", memory_budget_bytes=budget)
    two_stage_score(scorer, images[:50], captions, k=10, k_prime=k_prime)  # warm-up
    staged_before = two_stage_score(scorer, images, captions, k=10, k_prime=k_prime)
    exact = scorer.score(images, captions, k=10)
    staged = two_stage_score(scorer, images, captions, k=10, k_prime=k_prime)
    staged_seconds = max(staged_before.stats["seconds"], staged.stats["seconds"])  # conservative
    cos_metrics = retrieval_metrics(images @ captions.T, caption_to_image)
    exact_m = coco_recalls(exact.query_topk.indices, exact.item_topk.indices, caption_to_image)
    staged_m = coco_recalls(staged.query_topk.indices, staged.item_topk.indices, caption_to_image)
    print(f"  {num_images} x {num_images * 5}, d={dim}, adapter trained {steps} steps; "
          f"cosine alone R@1 i2t {cos_metrics['i2t_r1']:.1f} / t2i {cos_metrics['t2i_r1']:.1f}")
    for direction, topk_exact, topk_staged in (("i2t", exact.query_topk, staged.query_topk),
                                               ("t2i", exact.item_topk, staged.item_topk)):
        agree = topk_agreement(topk_exact, topk_staged)
        print(f"  {direction}: R@1 exact {exact_m[f'{direction}_r1']:.2f} vs two-stage "
              f"{staged_m[f'{direction}_r1']:.2f} (diff "
              f"{staged_m[f'{direction}_r1'] - exact_m[f'{direction}_r1']:+.2f} points); "
              f"top-1 agreement {agree['top1_agreement']:.2f}%, "
              f"top-10 overlap {agree['overlap_at_k']:.2f}%")
    print(f"  time: exact {exact.stats['seconds']:.2f} s ({exact.stats['pairs_per_second']:,.0f} "
          f"pairs/s); two-stage run before / after it {staged_before.stats['seconds']:.2f} / "
          f"{staged.stats['seconds']:.2f} s (cosine stage "
          f"{staged.stats['first_stage_seconds']:.2f} s) -> speed-up "
          f"{exact.stats['seconds'] / staged_seconds:.2f}x (against the slower run); "
          f"k'={k_prime}, adapter pairs {staged.stats['pairs']:,} = 1/"
          f"{1 / staged.stats['pair_fraction']:.1f} of all")


# ---------------------------------------------------------------- main
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--memory-seconds", type=float, default=10.0)
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument("--noise", type=float, default=4.0)
    # child-process mode (peak memory)
    parser.add_argument("--child-memory", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--nq", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ng", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, default=256 * MIB, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=15.0, help=argparse.SUPPRESS)
    parser.add_argument("--query-chunk", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, default=10, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child_memory:
        return child_memory(args)
    dim, budget = args.dim, args.budget_mib * MIB
    quick = args.quick
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU; d={dim}, "
          f"memory budget {args.budget_mib} MiB")
    print(f"[1] machine dense fp32 GEMM rate: {machine_rate():.1f} GFLOP/s (best of 2048^3 and "
          f"(8208x513)@(513x2048))")
    print("[2] exact chunked scorer, FLOP rate against the GEMM rate measured around each slice "
          f"(load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, shared)")
    threads = torch.get_num_threads()
    for count in sorted({threads, 1}, reverse=True):  # 1 thread: no stalls from other tenants
        torch.set_num_threads(count)
        section_rate(make_head(dim), 32, 2000 if quick else 5000, dim, 3 if quick else 6, budget)
    torch.set_num_threads(threads)
    print("[3] chunked vs naive scorer on a size where the naive one fits")
    section_naive(make_head(dim), dim, 50 if quick else 150, 500 if quick else 1000, budget)
    print("[4] peak working memory against the budget at two sizes")
    sizes = [(200, 1000), (1000, 5000)] if quick else [(1000, 5000), (5000, 25000)]
    section_memory(dim, sizes, budget, args.memory_seconds, naive_chunk=8)
    print("[5] two-stage mode (cosine top-k' candidates, adapter re-ranks) vs exact")
    section_two_stage(dim, 200 if quick else 1000, 100, 20 if quick else args.train_steps,
                      args.noise, budget)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
