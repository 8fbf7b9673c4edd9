"""Chunked pairwise scorer (chunk-based inference, paper appendix D).

Walks the (N_q, N_g) pair matrix block by block (Bq queries x Nc items, sized from a memory
budget), scores each block with a kernel from `vacsr.eval.kernels`, and keeps only what the metrics
need: per query its top-k items and per item its top-k queries, with scores and sigma_hat. Neither
the (N_q, N_g, d) similarity tensor nor the (N_q, N_g) matrix exists unless the full matrix is asked
for. Ranking keys (metrics.score_keys) make every top-k exact and deterministic: scores descending,
exact ties to the lower index, whatever the chunk sizes.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from vacsr.eval.kernels import build_kernel, elementwise_threads
from vacsr.eval.metrics import INVALID_KEY, decode_keys, score_keys, sortable_high

MERGE_BYTES_PER_PAIR = 96  # int64 keys of both directions, their concatenations, top-k scratch
_MAX_COLUMN = 2**32 - 1


@dataclass
class TopK:
    """Per row, the best k columns: indices (N, k) long (-1 = none), scores (N, k) float32
    (-inf = none), sigma (N, k) float32 sigma_hat of the pair, or None for heads without one."""

    indices: torch.Tensor
    scores: torch.Tensor
    sigma: torch.Tensor | None


@dataclass
class ScoreResult:
    query_topk: TopK  # per query, its best items
    item_topk: TopK  # per item, its best queries
    query_topk_grouped: TopK | None = None  # same, restricted to the query's own group (COCO 1K)
    item_topk_grouped: TopK | None = None
    scores: torch.Tensor | None = None  # (N_q, N_g) only when return_full
    sigma: torch.Tensor | None = None
    stats: dict = field(default_factory=dict)


class RunningTopK:
    """The best k (score, column) keys per row seen so far, merged block by block."""

    def __init__(self, num_rows: int, k: int, device: torch.device):
        self.k = k
        self.keys = torch.full((num_rows, k), INVALID_KEY, dtype=torch.int64, device=device)
        self.sigma: torch.Tensor | None = None
        self._device = device

    def merge(self, start: int, keys: torch.Tensor, sigma: torch.Tensor | None) -> None:
        """keys (r, c) int64 for rows start..start+r; sigma (r, c) or None."""
        rows = slice(start, start + keys.shape[0])
        top, pos = torch.cat([self.keys[rows], keys], dim=1).topk(self.k, dim=1)  # (r, k)
        self.keys[rows] = top
        if sigma is not None:
            if self.sigma is None:
                self.sigma = torch.full(self.keys.shape, math.nan, device=self._device)
            self.sigma[rows] = torch.cat([self.sigma[rows], sigma.float()], dim=1).gather(1, pos)

    def result(self) -> TopK:
        scores, indices = decode_keys(self.keys)
        sigma = None if self.sigma is None else self.sigma.masked_fill(indices < 0, math.nan).cpu()
        return TopK(indices=indices.cpu(), scores=scores.cpu(), sigma=sigma)


def merge_topk(parts: list[TopK], k: int) -> TopK:
    """Merge several TopK of the same rows (e.g. query shards scored apart), deterministically."""
    keys = torch.cat([score_keys(p.scores, p.indices.clamp(min=0))
                      .masked_fill(p.indices < 0, INVALID_KEY)
                      for p in parts], dim=1)
    k = min(k, keys.shape[1])
    top, pos = keys.topk(k, dim=1)
    scores, indices = decode_keys(top)
    sigma = None
    if all(p.sigma is not None for p in parts):
        sigma = torch.cat([p.sigma for p in parts], dim=1).gather(1, pos)
    return TopK(indices=indices, scores=scores, sigma=sigma)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class ChunkedScorer:
    """Scores all (query, item) pairs with a head, in blocks that fit memory_budget_bytes.

    precision "auto" = bf16 GEMMs on CUDA, fp32 on CPU. query_chunk / item_chunk override the
    planned block shape (tests use them to force chunk sizes that do not divide N).
    """

    def __init__(self, head: nn.Module, *, memory_budget_bytes: int = 256 * 2**20,
                 device: str | torch.device | None = None, precision: str = "auto",
                 query_chunk: int | None = None, item_chunk: int | None = None,
                 target_block_pairs: int | None = None, max_item_chunk: int = 2048):
        self.device = torch.device(device) if device is not None else default_device()
        if precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision must be auto, fp32 or bf16, not {precision!r}")
        use_bf16 = precision == "bf16" or (precision == "auto" and self.device.type == "cuda")
        self.dtype = torch.bfloat16 if use_bf16 else torch.float32
        self.kernel = build_kernel(head, self.device, self.dtype)
        self.memory_budget_bytes = int(memory_budget_bytes)
        self.query_chunk, self.item_chunk = query_chunk, item_chunk
        # CPU: ~16K pairs keep a block's activations near the last-level cache; a GPU wants
        # blocks as large as the budget allows (fewer, longer kernels)
        default_target = 2**14 if self.device.type == "cpu" else 2**22
        self.target_block_pairs = target_block_pairs or default_target
        self.max_item_chunk = max_item_chunk
        self._workspace: dict = {}  # block buffers, kept between calls (no re-allocation per epoch)

    # ------------------------------------------------------------ planning
    def block_bytes(self, num_q: int, num_g: int, grouped: bool = False) -> int:
        """Modelled peak transient bytes of one (num_q x num_g) block."""
        per_pair = self.kernel.bytes_per_pair() + MERGE_BYTES_PER_PAIR * (2 if grouped else 1)
        return (per_pair * num_q * num_g + self.kernel.bytes_per_query() * num_q
                + self.kernel.bytes_per_item() * num_g)

    def plan(self, num_queries: int, num_items: int, grouped: bool = False) -> tuple[int, int]:
        """Block shape (Bq, Nc): about target_block_pairs pairs (cache-sized), within the budget."""
        num_g = min(num_items, self.item_chunk or self.max_item_chunk)
        if not self.item_chunk:  # equal chunks: no thin (slow) last block of items
            num_g = math.ceil(num_items / math.ceil(num_items / max(num_g, 1)))
        num_q = self.query_chunk or max(1, self.target_block_pairs // max(num_g, 1))
        num_q = min(num_q, num_queries)
        if self.query_chunk or self.item_chunk:
            return num_q, num_g
        num_q = math.ceil(num_queries / math.ceil(num_queries / max(num_q, 1)))  # equal chunks too
        while self.block_bytes(num_q, num_g, grouped) > self.memory_budget_bytes:
            if num_q > 1:
                num_q = max(1, num_q // 2)
            elif num_g > 16:
                num_g //= 2
            else:
                raise ValueError(f"memory budget {self.memory_budget_bytes} B is too small for "
                                 "one block")
        return num_q, num_g

    # ------------------------------------------------------------ dense walk
    @torch.no_grad()
    def score(self, queries: torch.Tensor, items: torch.Tensor, *, k: int = 10,
              k_items: int | None = None, return_full: bool = False,
              query_groups: torch.Tensor | None = None,
              item_groups: torch.Tensor | None = None) -> ScoreResult:
        """queries (N_q, d), items (N_g, d) -> per-query top-k items and per-item top-k queries.

        With query_groups / item_groups (ints), also the top-k restricted to pairs of equal group.
        """
        num_q, num_g = queries.shape[0], items.shape[0]
        grouped = query_groups is not None
        if grouped != (item_groups is not None):
            raise ValueError("give both query_groups and item_groups, or neither")
        bq, nc = self.plan(num_q, num_g, grouped)
        walk = _Walk(self, num_q, num_g, min(k, num_g), min(k_items or k, num_q), grouped,
                     return_full)
        walk.workspace = self._workspace
        if grouped:
            walk.set_groups(query_groups, item_groups)
        queries, items = queries.to(self.device), items.to(self.device)
        start = time.perf_counter()
        item_buffer = None
        for q0 in range(0, num_q, bq):
            prepared_q = self.kernel.prepare_queries(queries[q0:q0 + bq])
            for g0 in range(0, num_g, nc):
                prepared_g = self.kernel.prepare_items(items[g0:g0 + nc], item_buffer)
                item_buffer = prepared_g if item_buffer is None else item_buffer
                logits, sigma = self.kernel.dense_block(prepared_q, prepared_g, walk.workspace)
                with elementwise_threads(self.device):
                    walk.add_block(q0, g0, logits, sigma)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        stats = {"pairs": num_q * num_g, "seconds": seconds, "block": (bq, nc),
                 "pairs_per_second": num_q * num_g / max(seconds, 1e-12),
                 "modelled_block_bytes": self.block_bytes(bq, nc, grouped)}
        return walk.result(stats)

    # ------------------------------------------------------------ listed pairs
    @torch.no_grad()
    def score_pairs(self, queries: torch.Tensor, items: torch.Tensor, query_index: torch.Tensor,
                    item_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scores of listed pairs (query_index[p], item_index[p]) -> logits, sigma (P,) float32
        CPU."""
        dim = queries.shape[1]
        element = torch.finfo(self.dtype).bits // 8
        per_pair = self.kernel.bytes_per_pair() + element * (dim + 1) + 2 * 4 * dim + 16
        chunk = max(1, min(self.target_block_pairs * 2, self.memory_budget_bytes // per_pair))
        queries = queries.to(self.device, torch.float32)
        items = items.to(self.device, torch.float32)
        query_index, item_index = query_index.to(self.device), item_index.to(self.device)
        logits, sigma = [], []
        for start in range(0, len(query_index), chunk):
            block_logits, block_sigma = self.kernel.pair_block(
                queries, items, query_index[start:start + chunk], item_index[start:start + chunk],
                self._workspace)
            logits.append(block_logits.cpu())
            sigma.append(None if block_sigma is None else block_sigma.cpu())
        if not logits:
            return torch.empty(0), None
        return torch.cat(logits), None if sigma[0] is None else torch.cat(sigma)


class _Walk:
    """Accumulators of one dense walk: top-k both directions, optional groups and full matrix."""

    def __init__(self, scorer: ChunkedScorer, num_q: int, num_g: int, k_q: int, k_g: int,
                 grouped: bool, return_full: bool):
        device = scorer.device
        self.workspace: dict = {}
        self.low_q = _MAX_COLUMN - torch.arange(num_q, device=device)  # (N_q,) low key bits
        self.low_g = _MAX_COLUMN - torch.arange(num_g, device=device)
        self.acc = [RunningTopK(num_q, k_q, device), RunningTopK(num_g, k_g, device)]
        self.grouped_acc = ([RunningTopK(num_q, k_q, device), RunningTopK(num_g, k_g, device)]
                            if grouped else None)
        self.full = (torch.empty(num_q, num_g), torch.empty(num_q, num_g)) if return_full else None
        self.full_has_sigma = True

    def set_groups(self, query_groups, item_groups):
        device = self.low_q.device
        self.query_groups = torch.as_tensor(query_groups, device=device).long()
        self.item_groups = torch.as_tensor(item_groups, device=device).long()

    def add_block(self, q0: int, g0: int, logits: torch.Tensor, sigma: torch.Tensor | None) -> None:
        """logits, sigma (b, c) of queries q0.. and items g0.. -> merged into every accumulator."""
        b, c = logits.shape
        high = sortable_high(logits)  # (b, c) int64: the score part of the keys
        keys_q = high + self.low_g[g0:g0 + c][None, :]  # rows: queries, columns: items
        keys_g = high.T + self.low_q[q0:q0 + b][None, :]  # rows: items, columns: queries
        sigma_t = None if sigma is None else sigma.T
        self.acc[0].merge(q0, keys_q, sigma)
        self.acc[1].merge(g0, keys_g, sigma_t)
        if self.grouped_acc is not None:
            same = self.query_groups[q0:q0 + b, None] == self.item_groups[None, g0:g0 + c]  # (b, c)
            if bool(same.any()):  # blocks across groups cannot change a grouped top-k
                self.grouped_acc[0].merge(q0, keys_q.masked_fill(~same, INVALID_KEY), sigma)
                self.grouped_acc[1].merge(g0, keys_g.masked_fill(~same.T, INVALID_KEY), sigma_t)
        if self.full is not None:
            self.full[0][q0:q0 + b, g0:g0 + c] = logits.cpu()
            if sigma is None:
                self.full_has_sigma = False
            else:
                self.full[1][q0:q0 + b, g0:g0 + c] = sigma.cpu()

    def result(self, stats: dict) -> ScoreResult:
        grouped = self.grouped_acc or [None, None]
        return ScoreResult(
            query_topk=self.acc[0].result(), item_topk=self.acc[1].result(),
            query_topk_grouped=grouped[0] and grouped[0].result(),
            item_topk_grouped=grouped[1] and grouped[1].result(),
            scores=None if self.full is None else self.full[0],
            sigma=None if self.full is None or not self.full_has_sigma else self.full[1],
            stats=stats)


# ---------------------------------------------------------------- references
@torch.no_grad()
def naive_score(head: nn.Module, queries: torch.Tensor, items: torch.Tensor,
                query_chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive scorer: expand s = d (v_i * t_j) for (queries x items x d) and run the explicit
    MLP (encode_pairs, decode) on it; query_chunk=None expands the whole problem at once.
    Memory grows as query_chunk x N_g x d: the baseline the chunked scorer is compared against."""
    chunk = query_chunk or queries.shape[0]
    logits, sigma = [], []
    for start in range(0, queries.shape[0], chunk):
        sim = head.scale * queries[start:start + chunk, None, :] * items[None, :, :]  # (b, N_g, d)
        mu, logvar, mix = head.encode_pairs(sim)
        del sim
        logits.append(head.decode(mu, mix))
        sigma.append(head.uncertainty(logvar, mix))
    return torch.cat(logits), torch.cat(sigma)
