"""What the synthetic generator (generate.py) writes of each classification layout, as numbers:
images per class of each split, the classes of each ImageNet variant, the image files' format.
The one rule generate.py writes by and a sweep's plan counts by, so that a `--plan` of the
embedded profile counts its data without writing it (vacsr/sweep/cost/counts.py; the ~15,700
images of base-to-novel cost seconds to write).
"""
from __future__ import annotations

from dataclasses import dataclass

from vacsr.data.imagenet import IMAGENET_1K, expected_classes

VARIANT_PER_CLASS = 1  # test images per class of an ImageNet variant
JPEG_LAYOUTS = ("coco", "fgvc_aircraft")  # the layouts whose image files are JPEG (else PNG)


@dataclass(frozen=True)
class SyntheticSizes:
    """How much generate_all writes: images per class of each split (train, val, test), and
    the classes of its ImageNet and of the ImageNet variants' shares of them (a smaller
    ImageNet is the real layout with fewer lines in classnames.txt: vacsr/data/imagenet.py)."""

    per_class: tuple[int, int, int] = (4, 3, 2)
    imagenet_classes: int = IMAGENET_1K


def images_per_class(name: str, per_class: tuple[int, int, int]) -> tuple[int, int | None, int]:
    """(train, val, test) images per class that generate(name, per_class=...) writes of a
    classification dataset. ImageNet has no val split (None: its few-shot val comes from the
    train images left after the few-shot draw), so it gets at least 4 train images per class and
    half the test images (at least one)."""
    train, val, test = per_class
    if name == "imagenet":
        return max(train, 4), None, max(1, test // 2)
    return train, val, test


def variant_labels(name: str, classes: int = IMAGENET_1K) -> range:
    """The ImageNet labels an ImageNet variant has images of, of an ImageNet of `classes` classes
    (ImageNet-1k's 1,000 unless told): all of them (V2, Sketch), or a fifth, every fifth label, from
    0 (-A) or from 1 (-R): different subsets, as in the real ones."""
    if expected_classes(name, classes) == classes:
        return range(classes)
    return range(0 if name == "imagenet_a" else 1, classes, 5)


def image_suffix(name: str) -> str:
    """The file suffix of the layout's images (its format: JPEG or PNG)."""
    return ".jpg" if name in JPEG_LAYOUTS else ".png"


def class_total(name: str, imagenet_classes: int = IMAGENET_1K) -> int:
    """The classes of generated classification dataset `name`: its real count, but ImageNet's
    `imagenet_classes`."""
    from vacsr.data.classification import DATASETS

    return imagenet_classes if name == "imagenet" else DATASETS[name].num_classes


def split_sizes(name: str, per_class: tuple[int, int, int], imagenet_classes: int = IMAGENET_1K,
                ) -> dict[str, dict[int, int] | None]:
    """Label -> images of each split ("train", "val": None for ImageNet, "test") of a generated
    classification dataset, every one of its classes present."""
    train, val, test = images_per_class(name, per_class)
    labels = range(class_total(name, imagenet_classes))
    return {"train": dict.fromkeys(labels, train),
            "val": None if val is None else dict.fromkeys(labels, val),
            "test": dict.fromkeys(labels, test)}


def variant_size(name: str, imagenet_classes: int = IMAGENET_1K) -> int:
    """Test images of a generated ImageNet variant (of an ImageNet of `imagenet_classes`)."""
    return VARIANT_PER_CLASS * len(variant_labels(name, imagenet_classes))
