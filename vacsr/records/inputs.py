"""A run's data as MLflow dataset inputs (name, source folder, digest of each split), so the
runs table's Dataset column and its dataset filter show what each run was trained and tested on.

Built from MLflow's public data API: `mlflow.data.meta_dataset.MetaDataset` (a dataset known by
its metadata only) on a `LocalArtifactDatasetSource`, logged through `MlflowClient.log_inputs`
with the split as the input's context tag (MLflow's "train" / "validation" / "test" wording).
"""
from __future__ import annotations

import json

from vacsr.data.digest import SplitFingerprint
from vacsr.data.digest import fingerprints as split_fingerprints

CONTEXTS = {"train": "train", "val": "validation", "test": "test"}


def dataset_inputs(name: str, prints: list[SplitFingerprint]) -> list:
    """One `mlflow.entities.DatasetInput` per split."""
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.data.sources import LocalArtifactDatasetSource
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = []
    for split in prints:
        entity = MetaDataset(LocalArtifactDatasetSource(split.source), name=name,
                             digest=split.digest).to_dict()
        profile = {"split": split.split, "items": split.items}
        if split.classes is not None:
            profile["classes"] = split.classes
        inputs.append(DatasetInput(
            Dataset(**entity, profile=json.dumps(profile)),
            tags=[InputTag(MLFLOW_DATASET_CONTEXT, CONTEXTS.get(split.split, split.split))]))
    return inputs


def fingerprints(data, seed: int) -> list[SplitFingerprint]:
    """The splits a run with this DataConfig and seed reads (as training builds them), each
    fingerprinted."""
    from vacsr.data import build_splits  # the loaders: imported only when splits are read

    return split_fingerprints(build_splits(data, seed))


def log_dataset_inputs(tracker, config) -> list[SplitFingerprint]:
    """Log the splits a run with `config` reads (its seed's few-shot draw) on the tracker's run."""
    prints = fingerprints(config.data, config.train.seed)
    tracker.client.log_inputs(tracker.run_id, datasets=dataset_inputs(config.data.dataset, prints))
    return prints
