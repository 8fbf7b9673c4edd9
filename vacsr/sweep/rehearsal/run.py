"""A rehearsed run: the lifecycle of a training run (vacsr/train/loop.py `Trainer.fit`) with its
epochs replaced by the wait and the curve of its UnitClock (vacsr/sweep/rehearsal/clock.py).

Everything around the epochs is a run's: its output folder and config.yaml, its MLflow run (tagged
REHEARSAL_TAG) with a metric per epoch and its end (FINISHED, or KILLED when Tune stops it inside
its report), a checkpoint per epoch that a restart continues from, metrics.json. The checkpoint
holds the history as JSON under the run's checkpoint file name, so that the sweep's checkpoint
handling (Tune's storage, the final seed's reuse of the best trial's) runs unchanged; nothing
loads it as a model. Where the run reports (a Tune trial) or keeps its checkpoint (a final seed's
Ray task) is the `RehearsalPlace`'s.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from vacsr.atomic import atomic_write_json
from vacsr.config import Config, save_config
from vacsr.errors import CheckpointError
from vacsr.sweep.rehearsal.clock import REHEARSAL_TAG, UnitClock
from vacsr.train.run_files import CHECKPOINT_FILE, CONFIG_FILE, METRICS_FILE
from vacsr.train.run_result import TrainResult

CHECKPOINT_KIND = "vacsr-rehearsal"  # what a rehearsed run's checkpoint file says it is
WAIT_METRIC = "rehearsal/wait_s"  # an epoch's wait, in each epoch's metrics


def write_checkpoint(path: Path, history: list[dict]) -> Path:
    atomic_write_json(path, {"kind": CHECKPOINT_KIND, "history": history})
    return path


def read_checkpoint(path: Path) -> list[dict]:
    """The history a rehearsed run's checkpoint holds; CheckpointError (one line) otherwise."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        raise CheckpointError(f"{path}: not a rehearsal's checkpoint (expected the JSON a "
                              "rehearsed run writes)") from None
    if not isinstance(data, dict) or data.get("kind") != CHECKPOINT_KIND:
        raise CheckpointError(f"{path}: not a rehearsal's checkpoint (expected kind "
                              f"{CHECKPOINT_KIND!r})")
    return list(data.get("history") or [])


class RehearsalPlace:
    """Where a rehearsed run restores from and reports to: by default its output folder (a final
    seed's run in a Ray task, which a retry continues)."""

    def restore(self, output_dir: Path) -> list[dict]:
        path = output_dir / CHECKPOINT_FILE
        return read_checkpoint(path) if path.is_file() else []

    def report(self, output_dir: Path, metrics: dict, history: list[dict]) -> None:
        write_checkpoint(output_dir / CHECKPOINT_FILE, history)


def rehearse(config: Config, clock: UnitClock, place: RehearsalPlace,
             tags: dict | None = None) -> TrainResult:
    """Run `config`'s rehearsal to its last epoch (continuing what `place` restores)."""
    from vacsr.records.logger import mlflow_logger

    output_dir = Path(config.train.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    history = place.restore(output_dir)
    start = len(history)
    opener = mlflow_logger(config)
    logger = None if opener is None else opener(
        resume=start > 0, tags={REHEARSAL_TAG: f"{clock.scale:g}", **(tags or {})})
    try:
        save_config(config, output_dir / CONFIG_FILE)
        for epoch in range(start, config.train.epochs):
            wait = clock.epoch_seconds(config, epoch)
            time.sleep(wait)
            # the wait, so that a run's wall time beyond it is the framework's (bench_scale.py)
            metrics = {**clock.epoch_metrics(config, epoch), WAIT_METRIC: round(wait, 6)}
            if start:
                metrics["resumed_from_epoch"] = start  # as a restored run's history says
            history.append(metrics)
            if logger is not None:
                logger(epoch, metrics, None)
            place.report(output_dir, metrics, history)  # last: Tune may end the run inside it
        if start >= config.train.epochs and history:
            place.report(output_dir, dict(history[-1]), history)  # a finished run restarted
    except BaseException as exc:
        if logger is not None:
            logger.fail("KILLED" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else "FAILED")
        raise
    result = TrainResult.of_history(history, output_dir / CHECKPOINT_FILE)
    atomic_write_json(output_dir / METRICS_FILE,
                      {"final": result.final_metrics, "history": history})
    if logger is not None:
        logger.finish(result, output_dir)
    return result
