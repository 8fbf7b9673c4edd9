"""A sweep's final checkpoints scored on one EvalPool (vacsr/distributed/eval_actor.py): the actors
start with the first checkpoint, train a seed's run of one worker in the first actor, and score
each later checkpoint with its head (final seed runs, `vacsr eval --actors`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import ray

from vacsr.distributed.eval_actor import EvalPool, ViewScores

if TYPE_CHECKING:
    import torch
    from torch import nn


class PoolScorer:
    """Scores encoded checkpoints (vacsr.train.eval_pass.EncodedSplit) on one EvalPool: the actors
    start with the first checkpoint and get each later one's head (final seed runs, `vacsr eval
    --actors`). `evaluate` gives a checkpoint's views' metrics; with one actor, they are all that
    actor sends back."""

    trains_any_run = False  # a run of several workers trains on Ray Train (final/seeds.py)

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
        pool, device = self._first(config)
        return pool.encode(config, str(checkpoint), tuple(views), device=device, **kwargs)

    def evaluate(self, config, checkpoint, views) -> list[ViewScores]:
        """Each view's metrics (encode, then this scorer's call). With one actor the view is
        encoded and scored in it (EvalWorker.evaluate, the same metrics): the caller, a sweep
        dataset's task, then receives numbers, not features."""
        if self.actors > 1:
            return [ViewScores.of(e, self(e)) for e in self.encode(config, checkpoint, views)]
        pool, device = self._first(config)
        return ray.get(pool.actors[0].evaluate.remote(config, str(checkpoint), tuple(views),
                                                      device=device))

    def checkpoint_error(self, config, path) -> str | None:
        """Why the checkpoint at `path` does not load, said by the first actor, or None."""
        pool, _ = self._first(config)
        return ray.get(pool.actors[0].checkpoint_error.remote(str(path)))

    def _first(self, config) -> tuple[EvalPool, str | None]:
        """The pool (started with the run's GPU share if need be) and the device its first
        actor encodes `config`'s run on."""
        gpus = config.train.gpus_per_worker
        # a run's share of a GPU (--gpus-per-worker 0.5): the next seed's run trains in this
        # actor (train), which then need not start again with the run's resources
        pool = self.pool or self._start(gpus=gpus or None)
        return pool, None if gpus else "cpu"

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
