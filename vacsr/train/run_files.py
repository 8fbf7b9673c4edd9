"""The files of a run's output folder, named once for the local trainer, the Ray Train workers,
the sweeps and tracking."""
from __future__ import annotations

CONFIG_FILE = "config.yaml"  # the resolved config the run trained with
CHECKPOINT_FILE = "last.ckpt"  # the last epoch's state (model, optimizer, history, config)
METRICS_FILE = "metrics.json"  # {"final": last epoch's metrics, "history": one dict per epoch}
FAILED_FILE = "failed.json"  # a Ray run's own error (bad data, a diverged loss), one line
LOCK_FILE = "train.lock"  # the FolderLock of the process training in the folder
