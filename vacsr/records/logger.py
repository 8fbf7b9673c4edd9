"""The MLflow run a trainer is handed (`Trainer.fit(open_logger=...)`): vacsr/train never opens
one itself, so the library core stays free of tracking code."""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vacsr.config import Config
    from vacsr.train.run_hooks import OpenLogger


def mlflow_logger(config: Config) -> OpenLogger | None:
    """The opener of the run's MLflow run where config.tracking asks for one (mlflow loads only
    then); None for a run that is not tracked."""
    if not config.tracking.enabled:
        return None
    from vacsr.records.callback import TrackingCallback

    return partial(TrackingCallback.from_config, config)
