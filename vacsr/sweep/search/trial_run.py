"""The training inside a one-worker trial's Tune trial actor: Tune's function-trainable protocol
(`tune.report` with a `tune.Checkpoint` each epoch, `tune.get_checkpoint` on a restart). The
trainable itself, which turns Tune's suggested values into the trial's config and picks where it
trains, is vacsr/sweep/search/trial.py; this module is what runs once it trains in the actor.

A run of one worker has nothing to distribute, and a TorchTrainer would start four more
processes for it (Ray Train's controller, its worker and two helper actors): on small runs that
is most of a trial's cost (benchmarks/bench_startup.py). The actor holds the worker's resources
(`train.cpus_per_worker`, `train.gpus_per_worker`; Ray sets CUDA_VISIBLE_DEVICES to its GPU), so
the run computes where a Train worker would. A lost actor (a dead node) is restarted by Tune from
the last reported checkpoint, up to `train.max_failures` times, as Ray Train restarts a lost
worker; an error of the run itself (a VacsrError: bad data, a diverged loss) is recorded in
FAILED_FILE, and Tune's retry of it ends at once with the same error instead of training again.
Runs of several workers stay on Ray Train (vacsr/sweep/search/trial.py).
"""
from __future__ import annotations

from pathlib import Path

from ray import tune

from vacsr.config import Config
from vacsr.distributed.ray_hooks import RayRun
from vacsr.errors import RunFailed, VacsrError
from vacsr.records.logger import mlflow_logger
from vacsr.sweep.search.recovery import outage
from vacsr.sweep.search.rung_gate import await_verdict, report_and_wait
from vacsr.train.failure import clear_run_failure, read_run_failure, record_run_failure


def recorded_failure(output_dir: Path) -> str | None:
    """The error an earlier attempt of this trial recorded, unless another try cures it (a full
    disk, a tracking server that did not answer: the resume retrains those,
    vacsr/sweep/search/recovery.py)."""
    error = read_run_failure(output_dir)
    if error is not None and outage(error):
        clear_run_failure(output_dir)
        return None
    return error


class TuneTrialRun(RayRun):
    """The run in the trial actor (rank 0 of one): it resumes from the trial's last Tune
    checkpoint and reports every epoch (metrics and checkpoint) to Tune, which persists the
    checkpoint and lets ASHA stop the trial."""

    def reported_checkpoint(self):
        return tune.get_checkpoint()

    def restore(self, trainer) -> None:
        super().restore(trainer)
        if 0 < trainer.start_epoch < trainer.config.train.epochs:
            await_verdict(trainer.start_epoch)  # restarted at a rung: not past it undecided

    def send(self, metrics: dict, folder: str | None) -> None:
        report_and_wait(metrics, tune.Checkpoint.from_directory(folder))

    def after_epoch(self, trainer, epoch: int, metrics: dict) -> None:
        return None  # the checkpoint goes to Tune with the report, after the epoch is logged

    def after_logging(self, trainer, epoch: int, metrics: dict) -> None:
        # last: when ASHA stops the trial on this report, the actor ends inside tune.report
        self.report(trainer, epoch, metrics)


def fit_in_trial(config: Config) -> None:
    """Train the trial's run in this process (the Tune trial actor), reporting to Tune."""
    output_dir = Path(config.train.output_dir)
    error = recorded_failure(output_dir)
    if error is not None:
        raise RunFailed(error)
    import torch

    from vacsr.compute_device import ray_worker_device
    from vacsr.distributed.worker_gpus import assigned_device, record_workers
    from vacsr.train.loop import Trainer

    try:  # train.device=cpu keeps the tensors on the CPU with a GPU reserved (logical GPUs)
        device = ray_worker_device(config.train.device, torch.device(assigned_device()))
        trainer = Trainer(config, device=device)
        record_workers(trainer.output_dir, 0, 1, device, ray_device=assigned_device())
        trainer.fit(TuneTrialRun(), open_logger=mlflow_logger(config))
    except VacsrError as exc:
        record_run_failure(output_dir, exc)
        raise

