"""Ray evaluation actors (the chunked scorer on Ray actors).

Each `EvalWorker` actor holds the item (gallery / class-text) features and the head weights, sent
once, and runs a `ChunkedScorer` on the query shards it is given; the first actor of a pool can
also encode a checkpoint's split (it holds what a run's worker holds: a GPU where there is one),
and train a run of one worker whose checkpoint it then encodes (a sweep's final seed runs).
`EvalPool` starts one actor per GPU (or a few CPU actors), shards the queries, and merges the
shards' top-k lists exactly (the ranking keys make the merge independent of the sharding). It has
the scorer's `score` / `score_pairs` interface, so `vacsr.eval.evaluate.evaluate_retrieval(...,
scorer=pool)` and `two_stage_score(pool, ...)` run on the actors while the driver only shards and
merges.
"""
from __future__ import annotations

import copy
import time

import ray
import torch
from torch import nn

from vacsr.eval.scorer import ChunkedScorer, ScoreResult, TopK, merge_topk


class EvalWorker:
    """Actor body: item features + head weights stay resident between calls."""

    def __init__(self, head: nn.Module | None, items: torch.Tensor | None, *,
                 memory_budget_bytes: int, precision: str = "auto", device: str | None = None):
        self.options = {"memory_budget_bytes": memory_budget_bytes, "precision": precision}
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.items, self.scorer = items, None  # None: set by the first scoring (after encode)
        if head is not None:
            self.set_head(head)

    def set_head(self, head: nn.Module, precision: str | None = None) -> None:
        if precision is not None:
            self.options["precision"] = precision
        self.scorer = ChunkedScorer(head, device=self.device, **self.options)

    def encode(self, config, checkpoint_path: str, views, **kwargs) -> list:
        """vacsr.train.eval_pass.encode_views in this actor: a sweep's final evaluation then
        starts no process of its own for the encoding (one start-up of torch and open_clip less
        per dataset), and builds the model once for all its views."""
        from vacsr.train.eval_pass import encode_views

        return encode_views(config, checkpoint_path, views, **kwargs)

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
        self.device = torch.device("cpu")  # where two_stage_score runs its cheap cosine stage
        self._items = items  # head and items may come later (a pool started to encode)
        self.precision = precision
        items_ref = None if items is None else ray.put(items.detach().cpu())
        head_ref = None if head is None else ray.put(_cpu_copy(head))
        self.actors = [self._actor(head_ref, items_ref) for _ in range(num_actors)]

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
    def score(self, queries: torch.Tensor, items: torch.Tensor | None = None, *, k: int = 10,
              k_items: int | None = None, return_full: bool = False, query_groups=None,
              item_groups=None) -> ScoreResult:
        """ChunkedScorer.score over the actors: queries sharded, results merged exactly."""
        self._sync_items(items)
        start = time.perf_counter()
        bounds = _shard_bounds(queries.shape[0], len(self.actors))
        futures = []
        for actor, (lo, hi) in zip(self.actors, bounds):
            groups = None if query_groups is None else torch.as_tensor(query_groups)[lo:hi]
            futures.append(actor.score_shard.remote(queries[lo:hi].detach().cpu(), lo, k,
                                                    k_items or k, return_full, groups, item_groups))
        parts = ray.get(futures)
        result = _merge_shards(parts, k_items or k)
        seconds = time.perf_counter() - start
        pairs = queries.shape[0] * self._items.shape[0]
        result.stats = {"pairs": pairs, "seconds": seconds, "pairs_per_second": pairs / seconds,
                        "actors": len(self.actors)}
        return result

    def score_pairs(self, queries: torch.Tensor, items: torch.Tensor | None,
                    query_index: torch.Tensor, item_index: torch.Tensor):
        """ChunkedScorer.score_pairs over the actors (pairs sharded in order)."""
        self._sync_items(items)
        queries_ref = ray.put(queries.detach().cpu())
        bounds = _shard_bounds(len(query_index), len(self.actors))
        parts = ray.get([actor.score_pairs.remote(queries_ref, query_index[lo:hi],
                                                  item_index[lo:hi])
                         for actor, (lo, hi) in zip(self.actors, bounds)])
        logits = torch.cat([p[0] for p in parts])
        sigma = None if any(p[1] is None for p in parts) else torch.cat([p[1] for p in parts])
        return logits, sigma


class PoolScorer:
    """Scores encoded checkpoints (vacsr.train.eval_pass.EncodedSplit) on one EvalPool: the actors
    start with the first checkpoint and get each later one's head (final seed runs, `vacsr eval
    --actors`)."""

    def __init__(self, actors: int, cpus_per_actor: float = 1) -> None:
        self.actors, self.cpus, self.pool = actors, cpus_per_actor, None

    def _start(self, head: nn.Module | None = None, items: torch.Tensor | None = None,
               precision: str = "auto", gpus: float | None = None) -> EvalPool:
        self.pool = EvalPool(head, items, num_actors=self.actors, num_cpus_per_actor=self.cpus,
                             num_gpus_per_actor=gpus, precision=precision)
        return self.pool

    def encode(self, config, checkpoint, views, **kwargs) -> list:
        """The test split of `checkpoint` in each view (dataset, subsample; eval_pass.View)
        encoded on the pool's first actor (started here if need be), which then scores them. A
        run that trained on CPUs is encoded on the CPU, in its precision, even where the actor
        holds a GPU (the metrics its validation computed)."""
        gpus = config.train.gpus_per_worker
        # a run's share of a GPU (--gpus-per-worker 0.5): the next seed's run trains in this
        # actor (train), which then need not start again with the run's resources
        pool = self.pool or self._start(gpus=gpus or None)
        return pool.encode(config, str(checkpoint), tuple(views),
                           device=None if gpus else "cpu", **kwargs)

    def train(self, config) -> tuple[str, tuple[str, ...]]:
        """A run of one worker trained in the pool's first actor, started with the run's
        resources (`train.cpus_per_worker`, `train.gpus_per_worker`) or kept where it has them;
        the pool's other actors stop meanwhile, so that the run holds a worker's resources and no
        more. A lost actor is started again and the run continues from its last checkpoint, up
        to `train.max_failures` times; the run's own error is raised as RunFailed (one line).
        Returns (the final checkpoint, the prefix cache's lines on damaged files it rebuilt)."""
        from vacsr.distributed.fault_injection import fail_once_spec
        from vacsr.train.failure import raise_if_run_failed

        train = config.train
        tries = train.max_failures + 1
        while True:
            pool = self.pool
            if pool is None or (pool.num_cpus_per_actor, pool.num_gpus_per_actor) != (
                    train.cpus_per_worker, train.gpus_per_worker):
                self.shutdown()
                pool = self.pool = EvalPool(None, None, num_actors=1,
                                            num_gpus_per_actor=train.gpus_per_worker,
                                            num_cpus_per_actor=train.cpus_per_worker)
            pool.resize(1)
            try:
                return ray.get(pool.actors[0].train.remote(config, fail_once_spec()))
            except ray.exceptions.RayActorError:
                self.shutdown()  # the actor (its node) is gone: a new one continues the run
                tries -= 1
                if not tries:
                    raise
            except ray.exceptions.RayTaskError:
                raise_if_run_failed(train.output_dir)  # the run's own error, in one line
                raise

    def __call__(self, encoded, **engine_kwargs) -> dict[str, float]:
        from vacsr.train.eval_pass import score_encoded

        if self.pool is None:
            self._start(encoded.head, encoded.items, encoded.precision)
        else:
            self.pool.resize(self.actors)  # a run trained in its first actor alone
            self.pool.update_head(encoded.head, precision=encoded.precision)
        return score_encoded(encoded, scorer=self.pool, **engine_kwargs)

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None  # a later call starts the actors again


def _shard_bounds(num: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal [lo, hi) ranges; empty shards are dropped."""
    edges = [round(i * num / shards) for i in range(shards + 1)]
    return [(lo, hi) for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]


def _merge_shards(parts: list[ScoreResult], k_items: int) -> ScoreResult:
    """Query-direction results concatenate (disjoint rows); item-direction ones merge by keys."""
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
