"""The 11 base-to-novel datasets and the 4 ImageNet variants, read from CoOp's on-disk layouts.

Ten datasets ship a split JSON (`{"train"|"val"|"test": [[impath, label, classname], ...]}`, paths
relative to the image folder, except Stanford Cars whose paths are relative to the dataset folder);
FGVC Aircraft ships `variants.txt` and `images_variant_{train,val,test}.txt`; ImageNet and its
variants are class folders (imagenet.py). Class names are taken as those files store them: CoOp's
renames (EuroSAT's "Annual Crop Land", Caltech's "airplane", SUN397's "indoor apse", UCF101's
"Apply_Eye_Makeup") were applied when the split files were written; underscores become spaces only
in the prompt (`ClassificationData.prompts`).

`load_classification` returns the splits of the CoOp / CoCoOp protocol (paper appendix C.1):
few-shot train and val, the full test split, restricted to the base or novel half and relabelled
0..k-1.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from vacsr.data.base import ClassificationData
from vacsr.data.checked_io import (
    check_files_exist,
    dataset_path,
    read_json,
    read_lines,
    require_dir,
)
from vacsr.data.fewshot import Item, group_by_label, label_set, load_or_sample, subsample_classes
from vacsr.data.imagenet import VARIANTS, read_classnames, read_imagenet, read_variant
from vacsr.data.validate import check_splits
from vacsr.errors import ConfigError, DataError

DEFAULT_TEMPLATE = "a photo of a {}."
SPLIT_EXPECTED = ("a JSON object with 'train', 'val' and 'test' lists of "
                  "[image path, integer label, class name]")
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset lives under data.root and how CoOp reads and prompts it."""

    folder: str  # dataset folder under the root
    image_dir: str  # folder the split paths are relative to ("" = the dataset folder)
    split_file: str | None  # CoOp's split JSON; None for Aircraft and the ImageNet family
    # the dataset's classes; the ImageNet family's are ImageNet-1k's, and a smaller ImageNet's
    # are the lines of its classnames.txt (imagenet.py, `class_count`)
    num_classes: int
    template: str = DEFAULT_TEMPLATE


DATASETS: dict[str, DatasetSpec] = {
    "caltech101": DatasetSpec("caltech-101", "101_ObjectCategories", "split_zhou_Caltech101.json",
                              100),
    "oxford_pets": DatasetSpec("oxford_pets", "images", "split_zhou_OxfordPets.json", 37,
                               "a photo of a {}, a type of pet."),
    "stanford_cars": DatasetSpec("stanford_cars", "", "split_zhou_StanfordCars.json", 196),
    "oxford_flowers": DatasetSpec("oxford_flowers", "jpg", "split_zhou_OxfordFlowers.json", 102,
                                  "a photo of a {}, a type of flower."),
    "food101": DatasetSpec("food-101", "images", "split_zhou_Food101.json", 101,
                           "a photo of {}, a type of food."),
    "fgvc_aircraft": DatasetSpec("fgvc_aircraft", "images", None, 100,
                                 "a photo of a {}, a type of aircraft."),
    "sun397": DatasetSpec("sun397", "SUN397", "split_zhou_SUN397.json", 397),
    "dtd": DatasetSpec("dtd", "images", "split_zhou_DescribableTextures.json", 47,
                       "{} texture."),
    "eurosat": DatasetSpec("eurosat", "2750", "split_zhou_EuroSAT.json", 10,
                           "a centered satellite photo of {}."),
    "ucf101": DatasetSpec("ucf101", "UCF-101-midframes", "split_zhou_UCF101.json", 101,
                          "a photo of a person doing {}."),
    "imagenet": DatasetSpec("imagenet", "images", None, 1000),
}
BASE_TO_NOVEL = tuple(DATASETS)
DOMAIN_SHIFT = tuple(VARIANTS)  # evaluated only: test split of the ImageNet-trained model
for _name, (_folder, _images, _count) in VARIANTS.items():
    DATASETS[_name] = DatasetSpec(_folder, _images, None, _count)
CLASSIFICATION_DATASETS = tuple(DATASETS)


def class_count(dataset_dir: Path, name: str, spec: DatasetSpec) -> int:
    """The classes the dataset in `dataset_dir` must have: ImageNet's are the lines of its
    classnames.txt (read again here: a thousand lines, against its listing's million files),
    every other dataset's are fixed."""
    if name == "imagenet":
        return len(read_classnames(dataset_dir / "classnames.txt"))
    return spec.num_classes


def _spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ConfigError(f"data.dataset: unknown classification dataset {name!r} "
                          f"(known: {', '.join(CLASSIFICATION_DATASETS)})")
    return DATASETS[name]


# ---------------------------------------------------------------- readers of the split files
def _entry_to_item(entry, prefix: str, path: Path, where: str) -> Item:
    if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
            and isinstance(entry[1], int) and not isinstance(entry[1], bool)
            and isinstance(entry[2], str)):
        raise DataError(f"{path}: {where} is {entry!r}; expected [image path, integer label, "
                        "class name]")
    return Item(f"{prefix}{dataset_path(entry[0], path, where)}", entry[1], entry[2])


def read_split_json(dataset_dir: Path, spec: DatasetSpec) -> dict[str, list[Item]]:
    """CoOp's `read_split`: item paths become relative to the dataset folder."""
    path = dataset_dir / spec.split_file
    data = read_json(path, SPLIT_EXPECTED)
    if not isinstance(data, dict):
        raise DataError(f"{path}: top level is a {type(data).__name__}; expected {SPLIT_EXPECTED}")
    prefix = f"{spec.image_dir}/" if spec.image_dir else ""
    splits = {}
    for split in SPLITS:
        entries = data.get(split)
        if not isinstance(entries, list) or not entries:
            raise DataError(f"{path}: no non-empty {split!r} list; expected {SPLIT_EXPECTED}")
        splits[split] = [_entry_to_item(entry, prefix, path, f"{split}[{index}]")
                         for index, entry in enumerate(entries)]
    return splits


def read_aircraft(dataset_dir: Path, spec: DatasetSpec) -> dict[str, list[Item]]:
    """CoOp's FGVCAircraft: labels are line numbers in variants.txt; `<image id> <variant>` lines
    name images/<image id>.jpg (variants may contain spaces and slashes)."""
    variants_path = dataset_dir / "variants.txt"
    variants = read_lines(variants_path, "one aircraft variant name per line")
    label_of: dict[str, int] = {}
    for label, name in enumerate(variants):
        if label_of.setdefault(name, label) != label:  # a repeat would leave a label unused
            raise DataError(f"{variants_path}: line {label + 1} repeats variant {name!r}; "
                            "expected each aircraft variant once")
    splits = {}
    for split in SPLITS:
        path = dataset_dir / f"images_variant_{split}.txt"
        items = []
        for number, line in enumerate(read_lines(path, "'<image id> <variant>' lines"), start=1):
            image_id, _, variant = line.partition(" ")
            if variant not in label_of:
                raise DataError(f"{path}: line {number} names variant {variant!r}, which is not in "
                                f"{variants_path}; expected '<image id> <variant>'")
            image = dataset_path(f"{image_id}.jpg", path, f"line {number}")
            items.append(Item(f"{spec.image_dir}/{image}", label_of[variant], variant))
        splits[split] = items
    return splits


def split_files(dataset_dir: Path, name: str, spec: DatasetSpec) -> dict[str, str]:
    """Split -> the file (ImageNet: the folder) that lists it, as errors name it."""
    if spec.split_file is not None:
        return {split: str(dataset_dir / spec.split_file) for split in SPLITS}
    if name == "imagenet":
        return {"train": str(dataset_dir / "images" / "train"),
                "test": str(dataset_dir / "images" / "val")}
    return {split: str(dataset_dir / f"images_variant_{split}.txt") for split in SPLITS}


def _read_splits(root: Path, name: str, spec: DatasetSpec
                 ) -> tuple[Path, dict[str, Sequence[Item] | None]]:
    if name == "imagenet":
        return read_imagenet(root)
    layout = (f"{spec.folder}/{spec.image_dir} with {spec.split_file}" if spec.split_file
              else f"{spec.folder}/images with variants.txt and images_variant_*.txt")
    dataset_dir = require_dir(root / spec.folder, f"the {name} layout {layout}")
    if spec.split_file is None:
        return dataset_dir, read_aircraft(dataset_dir, spec)
    return dataset_dir, read_split_json(dataset_dir, spec)


def read_dataset_splits(root: Path, name: str
                        ) -> tuple[Path, dict[str, Sequence[Item] | None]]:
    """(dataset folder, every item of each split) as a run lists them, before any sampling:
    what a sweep's plan counts (vacsr/sweep/cost/counts.py)."""
    return _read_splits(Path(root).expanduser().absolute(), name, _spec(name))


# ---------------------------------------------------------------- assembling ClassificationData
def classnames_of(items: Sequence[Item], source: str) -> list[str]:
    """Class names by label (Dassl's get_lab2cname), requiring labels 0..C-1 without gaps."""
    names: dict[int, str] = {}
    for item in items:
        names.setdefault(item.label, item.classname)
    if sorted(names) != list(range(len(names))):
        raise DataError(f"{source}: labels {sorted(names)[:5]}... are not 0..C-1; expected "
                        "consecutive labels starting at 0")
    return [names[label] for label in range(len(names))]


def _check_class_count(items: Sequence[Item], expected: int, source: str) -> None:
    # A partial download silently changes the benchmark; published numbers assume every class.
    found = len(label_set(items))
    if found != expected:
        raise DataError(f"{source}: found {found} classes in the train split; expected {expected}")


def to_data(items: Sequence[Item], dataset_dir: Path, classnames: list[str],
            template: str) -> ClassificationData:
    prefix = os.path.join(dataset_dir, "")  # one Path join per split, not per image
    return ClassificationData(images=[prefix + item.path for item in items],
                              labels=[item.label for item in items], classnames=list(classnames),
                              template=template)


def _check_images(dataset_dir: Path, source: str, *splits: Sequence[Item]) -> None:
    check_files_exist((dataset_dir / item.path for split in splits for item in split), source)


def load_domain_shift(root: str | Path, name: str) -> dict[str, ClassificationData]:
    """{"test": ...} of an ImageNet variant (classes as CoOp defines them, see imagenet.py)."""
    spec = _spec(name)
    dataset_dir, items, classnames, _ = read_variant(Path(root).expanduser().absolute(), name)
    image_dir = str(dataset_dir / VARIANTS[name][1])
    check_splits({"test": items}, len(classnames), {"test": image_dir}, dataset_dir)
    return {"test": to_data(items, dataset_dir, classnames, spec.template)}


def check_dataset_files(root: str | Path, name: str) -> dict[int, int] | None:
    """Every image any phase of a job may read from `name`, checked before the job starts:
    train and val (each seed's few-shot sample is drawn from them), and the whole test split
    (base and novel classes), with the entry checks of `load_classification`. A run loads only
    its subsample; a missing novel test image would otherwise surface after the training.
    ImageNet and its variants are class-folder listings: reading them is their check.
    Returns the train split's images per label (None for a variant, which has no train split)."""
    spec = _spec(name)
    root = Path(root).expanduser().absolute()
    if name in VARIANTS:
        load_domain_shift(root, name)
        return None
    dataset_dir, splits = _read_splits(root, name, spec)
    files = split_files(dataset_dir, name, spec)
    classes = class_count(dataset_dir, name, spec)
    check_splits(splits, classes, files, dataset_dir)
    _check_class_count(splits["train"], classes, files["train"])
    if name != "imagenet":  # see load_classification
        for split, items in splits.items():
            _check_images(dataset_dir, files[split], items)
    return {label: len(items) for label, items in group_by_label(splits["train"]).items()}


def load_classification(root: str | Path, name: str, *, shots: int, seed: int,
                        subsample: str = "base") -> dict[str, ClassificationData]:
    """The protocol's splits of a base-to-novel dataset (or the test split of a variant).

    base / all: {"train": K-shot train, "val": min(K, 4)-shot val, "test": full test};
    novel: {"val", "test"} of the novel classes (evaluated zero-shot with the base-trained model).
    """
    spec = _spec(name)
    root = Path(root).expanduser().absolute()  # trials may change the working directory (Ray)
    if name in VARIANTS:
        return load_domain_shift(root, name)
    dataset_dir, splits = _read_splits(root, name, spec)
    files = split_files(dataset_dir, name, spec)
    # every entry of every split, before any is sampled, filtered or relabelled (validate.py)
    classes = class_count(dataset_dir, name, spec)
    check_splits(splits, classes, files, dataset_dir)
    source = files["train"]
    _check_class_count(splits["train"], classes, source)
    few_train, few_val = load_or_sample(dataset_dir, splits["train"], splits["val"],
                                        shots=shots, seed=seed)
    train, val, test = subsample_classes(few_train, few_val, splits["test"], subsample=subsample)
    classnames = classnames_of(train, source)
    names = {"train": train, "val": val, "test": test}
    if subsample == "novel":
        names.pop("train")
    # ImageNet's items are its folder listing (kept current by the listing cache's fingerprints):
    # checking them would list its class folders again and undo the cache.
    if name != "imagenet":
        _check_images(dataset_dir, source, *names.values())
    return {key: to_data(items, dataset_dir, classnames, spec.template)
            for key, items in names.items()}
