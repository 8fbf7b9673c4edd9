"""One Tune trial = one training run of VACSR with the trial's suggested values.

The trial function runs in a Tune trial actor; it gets the dataset's resolved Config as an object
(`tune.with_parameters`) and applies the suggested values. A run of one worker trains in the
actor itself, which holds the worker's resources (vacsr/sweep/search/trial_run.py); a run of several
builds a TorchTrainer (workers reserved separately) whose `TuneReportCallback` forwards each
epoch's report to Tune. Either way every epoch reaches Tune, so ASHA can stop the trial.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback

from vacsr.config import Config, flat_dict, set_value, validate
from vacsr.sweep.plan.plan import trains_in_trial
from vacsr.sweep.search import rung_gate
from vacsr.sweep.search.rung_gate import GateSpec

CHECKPOINT_PATH_KEY = "checkpoint_path"  # the key TuneReportCallback gives the checkpoint's path


@dataclass(frozen=True)
class TrialMeta:
    """Where a dataset's trials write, and the MLflow run they hang under."""

    dataset: str
    trial_root: str  # local folder: one output folder per trial
    ray_storage: str  # Train checkpoints: a path or a URI
    tracking_uri: str
    experiment: str
    parent_run_id: str
    rehearsal: Optional[Any] = None  # a rehearsal's UnitClock (vacsr/sweep/rehearsal/clock.py)
    gate: Optional[GateSpec] = None  # where it waits for its rungs' decisions (rung_gate.py)


def with_suggestions(base: Config, suggested: dict[str, Any]) -> Config:
    """A copy of `base` with the suggested values (Tune's trial config), validated."""
    config = copy.deepcopy(base)
    for key, value in flat_dict(suggested).items():
        set_value(config, key, value)
    return validate(config)


def run_trial(suggested: dict[str, Any], base: Config, meta: TrialMeta) -> None:
    """Tune function trainable: one run, reporting every epoch to Tune. A run that failed by
    itself (bad data, a diverged loss) raises here, so the trial ends in ERROR. A trial that Tune
    stops (ASHA) ends inside its tune.report (SystemExit in the trial's thread; its MLflow run
    closes as KILLED), and only then may Tune reuse the actor for the next trial."""
    # Tune reuses this actor for the next trial once this one's thread has ended, and waits
    # TUNE_FUNCTION_THREAD_TIMEOUT_S (2 s by default) for that: a stopped or paused trial closes
    # its MLflow run on the way out, which a loaded tracking server can take longer to answer,
    # and a reset that times out fails the next trial before it starts
    os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", "120")
    config = with_suggestions(base, suggested)
    rung_gate.enter(meta.gate)
    trial_id = tune.get_context().get_trial_id()
    config.train.output_dir = str(Path(meta.trial_root) / trial_id)
    config.train.storage_path = meta.ray_storage
    config.train.eval_test = False  # trials are selected on val; test is for the final runs only
    from vacsr.records.sweep_records import place_child_run  # mlflow: not at this module's import

    place_child_run(config, tracking_uri=meta.tracking_uri, experiment=meta.experiment,
                    parent_run_id=meta.parent_run_id, run_name=f"{meta.dataset}-{trial_id}")
    if meta.rehearsal is not None:  # the run's waits and curve instead of its training
        from vacsr.sweep.rehearsal.trial import rehearse_in_trial

        rehearse_in_trial(config, meta.rehearsal, rung_gate.report_and_wait,
                          rung_gate.await_verdict)
        return
    if trains_in_trial(config.train):
        from vacsr.sweep.search.trial_run import (
            fit_in_trial,  # the model stack loads here, on demand
        )

        fit_in_trial(config)
        return
    # here, not at the top: the dataset's task imports this module for the trial function, and
    # Ray Train's torch layer would bring torch into that process, which trains nothing
    from vacsr.distributed.train import build_torch_trainer, raise_if_run_failed

    # Ray's documented Tune + Train pattern: TuneReportCallback hands each report of the run
    # (rank 0's metrics, plus the checkpoint's path) to this trial
    trainer = build_torch_trainer(config, name=trial_id, callbacks=[TuneReportCallback()])
    trainer.fit()
    raise_if_run_failed(config.train.output_dir)
