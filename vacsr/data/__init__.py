"""Datasets: records (base.py), synthetic data, loaders of the real on-disk layouts.

`build_retrieval` and `build_classification` turn a DataConfig into named splits (`build_splits`
picks one by the config's task, SPLIT_BUILDERS, which vacsr/tasks.py's tasks take theirs from);
the loaders, sampler and encodings a run uses are modules of their own. With `data.root` set, the
dataset names below read the real layouts (paper appendix C.1);
`vacsr.data.generate.generate_all(root)` writes synthetic data in those layouts.
`dataset="synthetic"` without a root keeps the in-memory synthetic data.
"""
from __future__ import annotations

from pathlib import Path

from vacsr.data.base import ClassificationData, RetrievalData
from vacsr.data.classification import (
    BASE_TO_NOVEL,
    CLASSIFICATION_DATASETS,
    DOMAIN_SHIFT,
    load_classification,
)
from vacsr.data.coco import load_coco
from vacsr.data.noise import make_noisy_index, noisy_caption_to_image
from vacsr.data.synthetic import synthetic_classification, synthetic_retrieval
from vacsr.errors import ConfigError
from vacsr.task_names import unknown_task

RETRIEVAL_DATASETS = ("coco",)


def _require_root(data, known: tuple[str, ...], task: str) -> None:
    if data.dataset not in known:
        raise ConfigError(f"data.dataset: unknown {task} dataset {data.dataset!r} "
                          f"(known: synthetic, {', '.join(known)})")
    if data.root is None:
        raise ConfigError(f"data.root: dataset {data.dataset!r} is read from disk; expected the "
                          "folder holding its layout (vacsr.data.generate writes a synthetic one)")


def build_retrieval(data, seed: int) -> dict[str, RetrievalData]:
    """DataConfig -> {"train": ..., "test": ...} image-caption splits (COCO adds "val").

    COCO: train = Karpathy train + restval (noisy at data.noise_ratio, the index saved to / read
    from data.noise_file), test = the 5K Karpathy test images with COCO image and caption ids.
    """
    if data.dataset == "synthetic" and data.root is None:
        splits = {
            "train": synthetic_retrieval(data.num_train, captions_per_image=data.captions_per_image,
                                         image_size=data.image_size, seed=seed),
            "test": synthetic_retrieval(data.num_test, captions_per_image=data.captions_per_image,
                                        image_size=data.image_size, seed=seed + 10_000,
                                        id_offset=1_000_000),
            "val": synthetic_retrieval(data.num_test, captions_per_image=data.captions_per_image,
                                       image_size=data.image_size, seed=seed + 20_000,
                                       id_offset=2_000_000),
        }
        if data.noise_ratio > 0:  # same NCR recipe, so noisy runs can be tried without COCO
            train = splits["train"]
            noisy = (noisy_caption_to_image(train.caption_to_image, data.noise_ratio, seed,
                                            Path(data.noise_file)) if data.noise_file else
                     make_noisy_index(train.caption_to_image, data.noise_ratio, seed)[0])
            train.caption_to_image = noisy.tolist()
        return splits
    _require_root(data, RETRIEVAL_DATASETS, "retrieval")
    return load_coco(data.root, noise_ratio=data.noise_ratio, seed=seed,
                     noise_file=data.noise_file, cache_dir=data.cache_dir)


def build_classification(data, seed: int) -> dict[str, ClassificationData]:
    """DataConfig -> {"train": few-shot, "val": few-shot, "test": ...} labelled splits.

    Base-to-novel datasets follow data.subsample_classes: "base" / "all" give train, val and test;
    "novel" gives the novel classes' val and test (evaluated with the base-trained model). The
    ImageNet variants give only "test" (domain generalisation of the ImageNet-trained model).
    """
    if data.dataset == "synthetic" and data.root is None:
        return {
            "train": synthetic_classification(data.shots, image_size=data.image_size, seed=seed),
            "val": synthetic_classification(min(data.shots, 4), image_size=data.image_size,
                                            seed=seed + 5_000),
            "test": synthetic_classification(8, image_size=data.image_size, seed=seed + 10_000),
        }
    _require_root(data, CLASSIFICATION_DATASETS, "classification")
    return load_classification(data.root, data.dataset, shots=data.shots, seed=seed,
                               subsample=data.subsample_classes)


# each task's splits by data.task (vacsr.task_names.TASK_NAMES): the tasks of vacsr/tasks.py
# take theirs from here, and what only reads data (a run's MLflow dataset inputs) needs no model
# stack to build them
SPLIT_BUILDERS = {"retrieval": build_retrieval, "classification": build_classification}


def build_splits(data, seed: int) -> dict:
    """The named splits of the DataConfig's task."""
    if data.task not in SPLIT_BUILDERS:
        raise unknown_task(data.task)
    return SPLIT_BUILDERS[data.task](data, seed)


__all__ = ["BASE_TO_NOVEL", "CLASSIFICATION_DATASETS", "ClassificationData", "DOMAIN_SHIFT",
           "RETRIEVAL_DATASETS", "RetrievalData", "SPLIT_BUILDERS", "build_classification",
           "build_retrieval", "build_splits"]
