"""One Tune trial = one Ray Train run of VACSR with the trial's suggested config.

The trial function runs in a Tune trial actor; it only builds a TorchTrainer (workers reserved
separately) and forwards each epoch's report to Tune with TuneReportCallback, so ASHA can stop it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback

from vacsr.config import Config, from_dict, set_value
from vacsr.distributed.train import build_torch_trainer


def flatten_nested(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"loss": {"beta": 1}} -> {"loss.beta": 1}; dotted keys pass through unchanged."""
    flat = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_nested(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def trial_config_to_config(trial_config: dict[str, Any]) -> Config:
    """Tune's trial config ({"base": flat config, "meta": ..., suggested sections}) -> Config."""
    config = from_dict(dict(trial_config["base"]))
    suggested = {k: v for k, v in trial_config.items() if k not in ("base", "meta")}
    for key, value in flatten_nested(suggested).items():
        set_value(config, key, value)
    return config


def run_trial(trial_config: dict[str, Any]) -> None:
    """Tune function trainable: one Ray Train run, reporting every epoch to Tune."""
    meta = trial_config["meta"]
    config = trial_config_to_config(trial_config)
    trial_id = tune.get_context().get_trial_id()
    config.train.output_dir = str(Path(meta["trial_root"]) / trial_id)
    config.train.storage_path = meta.get("ray_storage") or str(Path(meta["trial_root"]) / "ray")
    config.train.eval_test = False  # trials are selected on val; test is for the final runs only
    config.tracking.enabled = meta.get("tracking_uri") is not None
    config.tracking.uri = meta.get("tracking_uri")
    config.tracking.experiment = meta.get("experiment", config.tracking.experiment)
    config.tracking.parent_run_id = meta.get("parent_run_id")
    config.tracking.run_name = f"{meta.get('dataset', 'trial')}-{trial_id}"
    trainer = build_torch_trainer(config, name=trial_id, callbacks=[TuneReportCallback()])
    trainer.fit()
