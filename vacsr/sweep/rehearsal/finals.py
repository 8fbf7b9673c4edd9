"""A rehearsal's final seeds: each seed's run rehearsed (vacsr/sweep/rehearsal/run.py) in a Ray
task holding the run's resources, and its test views scored by the clock in a task holding an
evaluation actor's, for the seconds the cost model gives. The same calls as the sweep's
PoolScorer (vacsr/distributed/pool_scorer.py), which vacsr/sweep/final/seeds.py makes."""
from __future__ import annotations

import time

import ray

from vacsr.distributed.eval_actor import ViewScores
from vacsr.errors import CheckpointError
from vacsr.sweep.rehearsal.clock import UnitClock
from vacsr.sweep.rehearsal.run import RehearsalPlace, read_checkpoint, rehearse


def _rehearse_final(config, clock: UnitClock) -> tuple[str, tuple[str, ...]]:
    return str(rehearse(config, clock, RehearsalPlace()).checkpoint), ()


def _score(config, clock: UnitClock, views) -> list[ViewScores]:
    time.sleep(clock.test_seconds())
    return [ViewScores(clock.test_metrics(config, tuple(view))) for view in views]


class RehearsalScorer:
    """PoolScorer's calls for a rehearsal; every run trains here, one worker or several (their
    resources held by one task)."""

    trains_any_run = True

    def __init__(self, clock: UnitClock, cpus_per_actor: float = 1) -> None:
        self.clock, self.cpus = clock, cpus_per_actor

    def train(self, config) -> tuple[str, tuple[str, ...]]:
        train = config.train
        task = ray.remote(num_cpus=train.workers * train.cpus_per_worker,
                          num_gpus=train.workers * train.gpus_per_worker,
                          max_retries=train.max_failures)(_rehearse_final)
        return ray.get(task.remote(config, self.clock))

    def evaluate(self, config, checkpoint, views) -> list[ViewScores]:
        task = ray.remote(num_cpus=self.cpus, num_gpus=config.train.gpus_per_worker,
                          max_retries=0)(_score)
        return ray.get(task.remote(config, self.clock, [tuple(v) for v in views]))

    def checkpoint_error(self, config, path) -> str | None:
        try:
            read_checkpoint(path)
        except CheckpointError as exc:
            return str(exc)
        return None

    def shutdown(self) -> None:
        pass
