"""ImageNet and its four domain-shift variants, read from the folders CoOp's DATASETS.md describes.

- imagenet/images/{train,val}/<wnid>/*: label = index of the wnid among the sorted train folders;
  names from imagenet/classnames.txt (`<wnid> <name>` lines, the names CoOp uses).
- imagenetv2/imagenetv2-matched-frequency-format-val/<0..999>/*: folder i is the i-th line of
  classnames.txt.
- imagenet-sketch/images/<wnid>/*: 1000 sorted wnid folders.
- imagenet-adversarial/imagenet-a/<wnid>/* and imagenet-rendition/imagenet-r/<wnid>/*: the 200
  sorted wnid folders are the classes. As in CoOp, labels are 0..199 and the class names are those
  200 (a 200-way classifier); `read_variant` also returns their ImageNet-1k indices, for callers
  that evaluate with the 1000-way head instead.

Each variant folder holds its own copy of classnames.txt (CoOp's instructions); when it is absent
the one in imagenet/ is used.

ImageNet's classes are the lines of its classnames.txt: 1,000 for ImageNet-1k, where V2 and Sketch
have all 1,000 and A and R 200. A smaller ImageNet written in the same layout (a class subset, or
the synthetic one the tests use) is read the same way: V2 and Sketch then have a folder for each of
its classes and A and R a fifth of them (`expected_classes`).

The files of the class folders come from `list_tree`, which caches each folder tree's listing (as
CoOp's preprocessed.pkl does) so that a trial does not list ImageNet's 1.28M training files again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from vacsr.data.checked_io import read_lines, require_dir
from vacsr.data.fewshot import Item
from vacsr.data.folder_items import ClassFolder, FolderItems
from vacsr.data.listing_cache import list_tree
from vacsr.errors import DataError

CLASSNAMES_EXPECTED = "one '<wnid> <class name>' line per ImageNet class"

# config name -> (folder under root, image folder inside it, its classes of ImageNet-1k's 1,000)
VARIANTS: dict[str, tuple[str, str, int]] = {
    "imagenetv2": ("imagenetv2", "imagenetv2-matched-frequency-format-val", 1000),
    "imagenet_sketch": ("imagenet-sketch", "images", 1000),
    "imagenet_a": ("imagenet-adversarial", "imagenet-a", 200),
    "imagenet_r": ("imagenet-rendition", "imagenet-r", 200),
}


IMAGENET_1K = 1000


def expected_classes(name: str, imagenet_classes: int) -> int:
    """The class folders variant `name` has of an ImageNet of `imagenet_classes` classes: its
    share of ImageNet-1k's (1,000 of 1,000 for V2 and Sketch, 200 for A and R)."""
    return imagenet_classes * VARIANTS[name][2] // IMAGENET_1K


def read_classnames(path: Path) -> dict[str, str]:
    """wnid -> class name, in file order (the order defines ImageNet-1k label indices)."""
    names: dict[str, str] = {}
    for number, line in enumerate(read_lines(path, CLASSNAMES_EXPECTED), start=1):
        wnid, _, name = line.partition(" ")
        if not name.strip():
            raise DataError(f"{path}: line {number} {line!r} has no class name; "
                            f"expected {CLASSNAMES_EXPECTED}")
        if wnid in names:
            raise DataError(f"{path}: line {number} repeats wnid {wnid!r}; "
                            f"expected {CLASSNAMES_EXPECTED}")
        names[wnid] = name.strip()
    return names


def find_classnames(root: Path, folder: str) -> Path:
    """The variant's own classnames.txt, else the ImageNet one."""
    for candidate in (root / folder / "classnames.txt", root / "imagenet" / "classnames.txt"):
        if candidate.is_file():
            return candidate
    raise DataError(f"{root / folder / 'classnames.txt'}: file not found (nor in "
                    f"{root / 'imagenet'}); expected {CLASSNAMES_EXPECTED}")


def _folder_items(split_dir: Path, folders: list[str] | None, names: dict[str, str],
                  dataset_dir: Path, classnames_path: Path) -> tuple[list[str], FolderItems]:
    """(class folders, every image of them); label = position of the folder in `folders`
    (default: the sorted sub-folders of `split_dir`)."""
    listing = list_tree(split_dir, folders)
    for folder in listing:
        if folder not in names:
            raise DataError(f"{split_dir / folder}: class folder not listed in {classnames_path}; "
                            f"expected {CLASSNAMES_EXPECTED}")
    prefix = split_dir.relative_to(dataset_dir).as_posix()
    return list(listing), FolderItems([
        ClassFolder(f"{prefix}/{folder}/", label, names[folder], files)
        for label, (folder, files) in enumerate(listing.items())])


def read_imagenet(root: Path) -> tuple[Path, dict[str, Sequence[Item] | None]]:
    """(dataset folder, {"train", "val": None, "test"}); ImageNet's official val is the test split.

    There is no val split: the few-shot val is drawn from the remaining train images (fewshot.py).
    """
    dataset_dir = require_dir(root / "imagenet", "the ImageNet layout imagenet/images/{train,val}"
                              "/<wnid>/ with imagenet/classnames.txt")
    classnames_path = dataset_dir / "classnames.txt"
    names = read_classnames(classnames_path)
    splits: dict[str, Sequence[Item] | None] = {"val": None}
    folders_seen: list[str] | None = None
    for split, sub in (("train", "train"), ("test", "val")):
        split_dir = require_dir(dataset_dir / "images" / sub, "one folder per wnid")
        folders, splits[split] = _folder_items(split_dir, None, names, dataset_dir,
                                               classnames_path)
        if folders_seen is not None and folders != folders_seen:
            raise DataError(f"{split_dir}: class folders differ from images/train; expected the "
                            "same wnid folders in train and val")
        folders_seen = folders
    return dataset_dir, splits


def _check_count(image_dir: Path, found: int, expected: int) -> None:
    if found != expected:
        raise DataError(f"{image_dir}: found {found} class folders; expected {expected}")


def read_variant(root: Path, name: str) -> tuple[Path, Sequence[Item], list[str], list[int]]:
    """(dataset folder, test items, class names by label, ImageNet-1k index of each label)."""
    folder, image_sub, _ = VARIANTS[name]
    dataset_dir = require_dir(root / folder, f"the {name} layout {folder}/{image_sub}/")
    classnames_path = find_classnames(root, folder)
    names = read_classnames(classnames_path)
    expected = expected_classes(name, len(names))
    image_dir = require_dir(dataset_dir / image_sub, f"{expected} class folders")
    wnids = list(names)
    if name == "imagenetv2":  # folders 0..N-1 in classnames.txt order
        folders: list[str] | None = [str(i) for i in range(len(names))]
        _check_count(image_dir, len(folders), expected)
        for index in folders:
            require_dir(image_dir / index, f"class folders 0..{len(names) - 1}")
        by_folder = {str(i): names[w] for i, w in enumerate(wnids)}
    else:  # the sorted wnid folders
        folders, by_folder = None, names
    folders, items = _folder_items(image_dir, folders, by_folder, dataset_dir, classnames_path)
    _check_count(image_dir, len(folders), expected)
    class_wnids = wnids if name == "imagenetv2" else folders
    index_of = {wnid: i for i, wnid in enumerate(wnids)}
    return dataset_dir, items, [names[w] for w in class_wnids], [index_of[w] for w in class_wnids]
