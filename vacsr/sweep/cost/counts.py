"""How many images a sweep's runs read per dataset, counted from the same listings a run reads and
by the same rules (paper appendix C.1, CoOp's protocol), without writing anything: no few-shot
split cache (split_fewshot/*.pkl) and no listing cache (VACSR_LISTING_CACHE=read while counting:
a cache a run wrote is read, none is written). The embedded profile's synthetic data, not yet
written (a `--plan`), is counted by the same rules from the sizes the generator would write
(vacsr/data/synthetic_layout.py).

The counts do not depend on the seed: the few-shot draw keeps min(K, n_c) training images of each
class and min(K, 4) val images, whichever images it picks; base classes are the first ceil(n/2)
sorted labels, novel the rest (vacsr/data/fewshot.py).
"""
from __future__ import annotations

import contextlib
import math
import os
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from vacsr.data.fewshot import VAL_MAX_SHOTS, Item, group_by_label
from vacsr.data.synthetic_layout import SyntheticSizes
from vacsr.model.prompt_room import word_pieces

SAMPLES = 8  # image files the calibration decodes per dataset


@dataclass(frozen=True)
class DatasetCounts:
    """Images (and prompts) one run of a dataset reads."""

    train: int  # after few-shot sampling and the class subsample
    val: int
    test: int  # the test split of the classes trained on (base, or all)
    prompts: int  # texts per training step: the classes' prompts, or the batch's captions (0)
    evaluations: dict[str, int] = field(default_factory=dict)  # metric -> test images
    samples: tuple[str, ...] = ()  # a few training image files: the calibration decodes them
    # the most word pieces of a class name trained on (word_pieces; 0: no class prompts)
    name_pieces: int = 0
    # the share of the text tower's context a prompt method's prompts run over
    # (vacsr/model/prefix.py prompt_end), set by the plan for the unit's method; 1: all of it
    prompt_share: float = 1.0

    def as_dict(self) -> dict:
        return asdict(self)


def name_pieces(classnames: Sequence[str], labels: set[int]) -> int:
    """The most word pieces of the names of `labels` as prompts write them ("_" a space)."""
    return max((word_pieces(classnames[label].replace("_", " ")) for label in labels), default=0)


@contextlib.contextmanager
def listing_cache_read_only() -> Iterator[None]:
    """List folders reading the listing cache but never writing it (data/listing_cache.py)."""
    before = os.environ.get("VACSR_LISTING_CACHE")
    os.environ["VACSR_LISTING_CACHE"] = "read"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VACSR_LISTING_CACHE", None)
        else:
            os.environ["VACSR_LISTING_CACHE"] = before


def per_class(items: Sequence[Item]) -> dict[int, int]:
    """Label -> images of that label."""
    return {label: len(group) for label, group in group_by_label(items).items()}


def class_halves(labels: set[int], subsample: str) -> set[int]:
    """The labels a subsample keeps: base = the first ceil(n/2) sorted labels, novel the rest."""
    ordered = sorted(labels)
    half = math.ceil(len(ordered) / 2)
    return set({"all": ordered, "base": ordered[:half], "novel": ordered[half:]}[subsample])


def split_counts(name: str, train: Mapping[int, int], val: Mapping[int, int] | None,
                 test: Mapping[int, int], shots: int, subsample: str,
                 evaluations: dict[str, tuple[str | None, str]],
                 variant_test: Callable[[str], int], classnames: Sequence[str]) -> DatasetCounts:
    """Counts of a classification dataset from its images per label of each split (val None:
    ImageNet's); `evaluations`: metric -> (dataset or None, classes); `variant_test`: the test
    images of an evaluation's own dataset; `classnames`: by label."""
    kept = {label: min(shots, n) for label, n in train.items()}
    if val is None:  # ImageNet: val drawn from the train images not drawn for train
        val = {label: min(shots, VAL_MAX_SHOTS, n - kept[label]) for label, n in train.items()}
    else:
        val = {label: min(shots, VAL_MAX_SHOTS, n) for label, n in val.items()}
    chosen = class_halves(set(train), subsample)
    found: dict[str, int] = {}
    for metric, (dataset, classes) in evaluations.items():
        if dataset is None:
            found[metric] = sum(test.get(label, 0) for label in class_halves(set(train), classes))
        else:
            found[metric] = variant_test(dataset)
    return DatasetCounts(train=sum(kept[label] for label in chosen),
                         val=sum(val.get(label, 0) for label in chosen),
                         test=sum(test.get(label, 0) for label in chosen),
                         prompts=len(chosen), evaluations=found,
                         name_pieces=name_pieces(classnames, chosen))


def classification_counts(root: Path, name: str, shots: int, subsample: str,
                          evaluations: dict[str, tuple[str | None, str]]) -> DatasetCounts:
    """Counts of a classification dataset under `root`, from the listings a run reads."""
    from vacsr.data.classification import read_dataset_splits

    with listing_cache_read_only():
        folder, splits = read_dataset_splits(root, name)
    val = None if splits["val"] is None else per_class(splits["val"])
    names = {label: group[0].classname for label, group in group_by_label(splits["train"]).items()}
    counts = split_counts(name, per_class(splits["train"]), val,
                          Counter(item.label for item in splits["test"]), shots, subsample,
                          evaluations, lambda dataset: variant_count(root, dataset),
                          [names[label] for label in sorted(names)])
    return replace(counts, samples=first_images(folder, splits["train"]))


def synthetic_counts(kind, dataset: str, shots: int, sizes: SyntheticSizes) -> DatasetCounts:
    """The counts of `dataset` of `kind` (a SweepKind, classification) in the synthetic data
    generate_all would write at `sizes`, computed without writing it (no samples)."""
    from vacsr.data.generate import synthetic_classnames
    from vacsr.data.synthetic_layout import split_sizes, variant_size

    split = split_sizes(dataset, sizes.per_class, sizes.imagenet_classes)
    evaluations = {e.metric: (e.dataset, e.classes) for e in kind.evaluations}
    return split_counts(dataset, split["train"], split["val"], split["test"], shots,
                        kind.train_classes, evaluations,
                        lambda variant: variant_size(variant, sizes.imagenet_classes),
                        synthetic_classnames(dataset, sizes.imagenet_classes))


def first_images(folder: Path, items: Sequence[Item], count: int = SAMPLES) -> tuple[str, ...]:
    """The first image file of each of the first `count` classes."""
    groups = list(group_by_label(items).values())[:count]
    return tuple(str(folder / group[0].path) for group in groups)


def variant_count(root: Path, name: str) -> int:
    """Test images of an ImageNet variant (domain generalisation)."""
    from vacsr.data.imagenet import read_variant

    with listing_cache_read_only():
        return len(read_variant(root, name)[1])


def retrieval_counts(root: Path) -> DatasetCounts:
    """Images of COCO's Karpathy splits; a step's texts are its images' captions (prompts 0)."""
    from vacsr.data.coco import KARPATHY_FILE, SPLITS, image_root, read_karpathy

    images = read_karpathy(root / "coco" / KARPATHY_FILE)
    sizes = {split: sum(image.split in members for image in images)
             for split, members in SPLITS.items()}
    folder = image_root(root / "coco")
    return DatasetCounts(train=sizes["train"], val=sizes["val"], test=sizes["test"], prompts=0,
                         samples=tuple(str(folder / im.path) for im in images[:SAMPLES]))


def count_dataset(kind, root: Path, dataset: str, shots: int) -> DatasetCounts:
    """The counts of one dataset of `kind` (a SweepKind) under `root`."""
    if kind.task == "retrieval":
        if dataset == "synthetic":  # generated in memory by each run (data.num_train)
            from vacsr.config import DataConfig

            data = DataConfig()
            return DatasetCounts(train=data.num_train, val=data.num_test, test=data.num_test,
                                 prompts=0)
        return retrieval_counts(root)
    evaluations = {e.metric: (e.dataset, e.classes) for e in kind.evaluations}
    return classification_counts(root, dataset, shots, kind.train_classes, evaluations)


def class_prompts(dataset: str, subsample: str) -> int:
    """Prompts a classification step encodes: the classes of the subsample, from the dataset's
    class count (its loader refuses a layout with other classes), ImageNet-1k's for ImageNet.
    The memory check reads it before any dataset is counted: for a smaller ImageNet an upper
    bound (the time estimate reads the counted classes, `DatasetCounts.prompts`)."""
    from vacsr.data.classification import DATASETS

    return len(class_halves(set(range(DATASETS[dataset].num_classes)), subsample))


def step_prompts(kind, dataset: str) -> int:
    """Prompts a training step of `kind` (a SweepKind) encodes on `dataset` (0: the batch's
    captions)."""
    return 0 if kind.task == "retrieval" else class_prompts(dataset, kind.train_classes)
