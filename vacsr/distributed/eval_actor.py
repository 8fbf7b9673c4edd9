"""Ray evaluation actors (the chunked scorer on Ray actors).

Each `EvalWorker` actor holds the item (gallery / class-text) features and the head weights, sent
once, and runs a `ChunkedScorer` on the query shards it is given; the first actor of a pool can
also encode a checkpoint's split (it holds what a run's worker holds: a GPU where there is one),
and train a run of one worker whose checkpoint it then encodes (a sweep's final seed runs).
`EvalPool` starts one actor per GPU (or a few CPU actors), shards the queries, and merges the
shards' top-k lists exactly (the ranking keys make the merge independent of the sharding). It has
the scorer's `score` / `score_pairs` interface, so `vacsr.eval.evaluate.evaluate_retrieval(...,
scorer=pool)` and `two_stage_score(pool, ...)` run on the actors while the driver only shards and
merges. `PoolScorer` (vacsr/distributed/pool_scorer.py) runs a sweep's final checkpoints on a pool.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ray

if TYPE_CHECKING:
    import torch
    from torch import nn

    from vacsr.eval.scorer import ScoreResult

# torch and the scorer are imported where they are used: a sweep dataset's task imports this
# module to start the actors and reads only numbers back from them (PoolScorer.evaluate)


class EvalWorker:
    """Actor body: item features + head weights stay resident between calls."""

    def __init__(self, head: nn.Module | None, items: torch.Tensor | None, *,
                 memory_budget_bytes: int, precision: str = "auto", device: str | None = None):
        import torch

        self.options = {"memory_budget_bytes": memory_budget_bytes, "precision": precision}
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.items, self.scorer = items, None  # None: set by the first scoring (after encode)
        if head is not None:
            self.set_head(head)

    def set_head(self, head: nn.Module, precision: str | None = None) -> None:
        from vacsr.eval.scorer import ChunkedScorer

        if precision is not None:
            self.options["precision"] = precision
        self.scorer = ChunkedScorer(head, device=self.device, **self.options)

    def encode(self, config, checkpoint_path: str, views, **kwargs) -> list:
        """vacsr.train.eval_pass.encode_views in this actor: a sweep's final evaluation then
        starts no process of its own for the encoding (one start-up of torch and open_clip less
        per dataset), and builds the model once for all its views."""
        from vacsr.train.eval_pass import encode_views

        return encode_views(config, checkpoint_path, views, **kwargs)

    def evaluate(self, config, checkpoint_path: str, views, **kwargs) -> list[ViewScores]:
        """Each view encoded here (encode), then scored here as a pool of this one actor scores
        it: the same shard, calls and merge (_OwnPool), so the metrics are the pool's. No
        features leave the actor."""
        from vacsr.train.eval_pass import score_encoded

        scored = []
        for encoded in self.encode(config, checkpoint_path, views, **kwargs):
            self.set_head(_cpu_copy(encoded.head), precision=encoded.precision)
            scored.append(ViewScores.of(encoded, score_encoded(encoded, scorer=_OwnPool(self))))
        return scored

    def checkpoint_error(self, path: str) -> str | None:
        """Why `path` does not load as a checkpoint, or None (checkpoint_problem, here)."""
        from vacsr.train.checkpoint import checkpoint_problem

        return checkpoint_problem(path)

    def train(self, config, fail_once: str | None = None) -> tuple[str, tuple[str, ...]]:
        """A one-worker run trained in this actor (vacsr/distributed/actor_run.py), which holds
        the run's worker resources: its final checkpoint is then encoded here too."""
        from vacsr.distributed.actor_run import fit_in_actor

        return fit_in_actor(config, fail_once)

    def set_items(self, items: torch.Tensor) -> None:
        self.items = items

    def describe(self) -> dict:
        return {"device": str(self.scorer.device), "dtype": str(self.scorer.dtype),
                "num_items": int(self.items.shape[0])}

    def score_shard(self, queries: torch.Tensor, query_offset: int, k: int, k_items: int,
                    return_full: bool = False, query_groups=None, item_groups=None) -> ScoreResult:
        """Score queries (global rows query_offset..) against the held items; the item-direction
        top-k holds global query indices so that the driver can merge shards directly."""
        import torch

        result = self.scorer.score(queries, self.items, k=k, k_items=k_items,
                                   return_full=return_full, query_groups=query_groups,
                                   item_groups=item_groups)
        for topk in (result.item_topk, result.item_topk_grouped):
            if topk is not None:
                topk.indices = torch.where(topk.indices >= 0, topk.indices + query_offset, -1)
        return result

    def score_pairs(self, queries: torch.Tensor, query_index: torch.Tensor,
                    item_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.scorer.score_pairs(queries, self.items, query_index, item_index)


EvalActor = ray.remote(EvalWorker)


@dataclass
class ViewScores:
    """A view's metrics as its evaluation actor scored them, and the prefix cache's counts of
    its encoding (eval_pass.EncodedSplit's)."""

    metrics: dict[str, float]
    cache_served: int = 0
    cache_evaluated: int = 0
    cache_rebuilt: tuple[str, ...] = ()

    @classmethod
    def of(cls, encoded, metrics: dict[str, float]) -> ViewScores:
        """`metrics` of an EncodedSplit, with its prefix cache's counts."""
        return cls(metrics, encoded.cache_served, encoded.cache_evaluated, encoded.cache_rebuilt)


def _cpu_copy(head: nn.Module) -> nn.Module:
    return copy.deepcopy(head).cpu().eval()


class EvalPool:
    """A small pool of EvalWorker actors: one per GPU, or num_actors CPU actors.

    Needs ray.init() to have been called. update_head() re-sends only the weights (each epoch or
    trial); the item features are re-sent only when score() receives different ones.
    """

    def __init__(self, head: nn.Module | None, items: torch.Tensor | None, *,
                 num_actors: int | None = None,
                 num_gpus_per_actor: float | None = None, num_cpus_per_actor: float = 1,
                 memory_budget_bytes: int = 256 * 2**20, precision: str = "auto"):
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if num_gpus_per_actor is None:
            num_gpus_per_actor = 1 if gpus else 0
        if num_actors is None:
            num_actors = max(1, gpus) if num_gpus_per_actor else 1
        self.memory_budget_bytes = memory_budget_bytes
        self.num_gpus_per_actor, self.num_cpus_per_actor = num_gpus_per_actor, num_cpus_per_actor
        self._items = items  # head and items may come later (a pool started to encode)
        self.precision = precision
        items_ref = None if items is None else ray.put(items.detach().cpu())
        head_ref = None if head is None else ray.put(_cpu_copy(head))
        self.actors = [self._actor(head_ref, items_ref) for _ in range(num_actors)]

    @property
    def device(self):
        """Where two_stage_score runs its cheap cosine stage (torch is imported here, by the
        scoring, not by starting the pool)."""
        import torch

        return torch.device("cpu")

    def _actor(self, head_ref=None, items_ref=None):
        options = {"num_cpus": self.num_cpus_per_actor, "num_gpus": self.num_gpus_per_actor}
        return EvalActor.options(**options).remote(
            head_ref, items_ref, memory_budget_bytes=self.memory_budget_bytes,
            precision=self.precision)

    def resize(self, num_actors: int) -> None:
        """Keep the first `num_actors` actors (a run trains in the first alone), or start more;
        new ones get the head and items with the next scoring (update_head, then score)."""
        for actor in self.actors[num_actors:]:
            ray.kill(actor)
        added = [self._actor() for _ in range(num_actors - len(self.actors))]
        self.actors = self.actors[:num_actors] + added
        if added:
            self._items = None  # sent again to every actor by the next score

    # ------------------------------------------------------------ state
    def update_head(self, head: nn.Module, precision: str | None = None) -> None:
        ref = ray.put(_cpu_copy(head))
        ray.get([a.set_head.remote(ref, precision) for a in self.actors])

    def update_items(self, items: torch.Tensor) -> None:
        ref = ray.put(items.detach().cpu())
        ray.get([a.set_items.remote(ref) for a in self.actors])
        self._items = items

    def _sync_items(self, items: torch.Tensor | None) -> None:
        import torch

        if items is None or items is self._items:
            return
        held = self._items
        if held is None or items.shape != held.shape or not torch.equal(items.cpu(), held.cpu()):
            self.update_items(items)

    def encode(self, config, checkpoint_path: str, views, **kwargs) -> list:
        """A checkpoint's split in each view encoded on the first actor (EvalWorker.encode)."""
        return ray.get(self.actors[0].encode.remote(config, checkpoint_path, views, **kwargs))

    def describe(self) -> list[dict]:
        return ray.get([a.describe.remote() for a in self.actors])

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []

    # ------------------------------------------------------------ scoring
    # how a shard reaches its actor: a Ray call here, a plain call in _OwnPool
    @staticmethod
    def _call(actor, method: str, *args):
        return getattr(actor, method).remote(*args)

    @staticmethod
    def _gather(futures: list) -> list:
        return ray.get(futures)

    @staticmethod
    def _share(tensor):
        return ray.put(tensor)

    def score(self, queries: torch.Tensor, items: torch.Tensor | None = None, *, k: int = 10,
              k_items: int | None = None, return_full: bool = False, query_groups=None,
              item_groups=None) -> ScoreResult:
        """ChunkedScorer.score over the actors: queries sharded, results merged exactly."""
        import torch

        self._sync_items(items)
        start = time.perf_counter()
        bounds = _shard_bounds(queries.shape[0], len(self.actors))
        futures = []
        for actor, (lo, hi) in zip(self.actors, bounds):
            groups = None if query_groups is None else torch.as_tensor(query_groups)[lo:hi]
            futures.append(self._call(actor, "score_shard", queries[lo:hi].detach().cpu(), lo, k,
                                      k_items or k, return_full, groups, item_groups))
        parts = self._gather(futures)
        result = _merge_shards(parts, k_items or k)
        seconds = time.perf_counter() - start
        pairs = queries.shape[0] * self._items.shape[0]
        result.stats = {"pairs": pairs, "seconds": seconds, "pairs_per_second": pairs / seconds,
                        "actors": len(self.actors)}
        return result

    def score_pairs(self, queries: torch.Tensor, items: torch.Tensor | None,
                    query_index: torch.Tensor, item_index: torch.Tensor):
        """ChunkedScorer.score_pairs over the actors (pairs sharded in order)."""
        import torch

        self._sync_items(items)
        queries_ref = self._share(queries.detach().cpu())
        bounds = _shard_bounds(len(query_index), len(self.actors))
        parts = self._gather([self._call(actor, "score_pairs", queries_ref, query_index[lo:hi],
                                         item_index[lo:hi])
                              for actor, (lo, hi) in zip(self.actors, bounds)])
        logits = torch.cat([p[0] for p in parts])
        sigma = None if any(p[1] is None for p in parts) else torch.cat([p[1] for p in parts])
        return logits, sigma


class _OwnPool(EvalPool):
    """An EvalPool whose one actor is the EvalWorker it runs in (EvalWorker.evaluate): the
    pool's shard bounds, calls and merge, without Ray between them."""

    def __init__(self, worker: EvalWorker) -> None:  # no actors to start: it is their one
        self.actors = [worker]
        self.memory_budget_bytes = worker.options["memory_budget_bytes"]
        self._items = None

    def update_items(self, items: torch.Tensor) -> None:
        self.actors[0].set_items(items.detach().cpu())
        self._items = items

    @staticmethod
    def _call(actor, method: str, *args):
        return getattr(actor, method)(*args)

    @staticmethod
    def _gather(futures: list) -> list:
        return futures

    @staticmethod
    def _share(tensor):
        return tensor


def _shard_bounds(num: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal [lo, hi) ranges; empty shards are dropped."""
    edges = [round(i * num / shards) for i in range(shards + 1)]
    return [(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]


def _merge_shards(parts: list[ScoreResult], k_items: int) -> ScoreResult:
    """Query-direction results concatenate (disjoint rows); item-direction ones merge by keys."""
    import torch

    from vacsr.eval.scorer import ScoreResult, TopK, merge_topk

    def cat_rows(topks: list[TopK | None]) -> TopK | None:
        if topks[0] is None:
            return None
        sigma = None if topks[0].sigma is None else torch.cat([t.sigma for t in topks])
        return TopK(indices=torch.cat([t.indices for t in topks]),
                    scores=torch.cat([t.scores for t in topks]), sigma=sigma)

    grouped = [p.item_topk_grouped for p in parts]
    return ScoreResult(
        query_topk=cat_rows([p.query_topk for p in parts]),
        item_topk=merge_topk([p.item_topk for p in parts], k_items),
        query_topk_grouped=cat_rows([p.query_topk_grouped for p in parts]),
        item_topk_grouped=None if grouped[0] is None else merge_topk(grouped, k_items),
        scores=None if parts[0].scores is None else torch.cat([p.scores for p in parts]),
        sigma=None if parts[0].sigma is None else torch.cat([p.sigma for p in parts]))
