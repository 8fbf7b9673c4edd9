"""One check of the entries every classification reader returns, for every split.

CoOp's readers take a split's entries on trust, and wrong ones do not fail, they change the
benchmark: a test label outside the classes is dropped by the base/novel filter (or breaks the
accuracy with subsample "all"), a second class name for a label changes the prompt that label is
scored with, an image listed twice counts twice, and a file name that is not UTF-8 cannot be
logged or cached. `check_splits` refuses each with one line naming the file and the entry.

It runs on every load over every entry (ImageNet's train split: 1.28M images), so it reads memory
only: list splits entry by entry, class-folder splits (folder_items.FolderItems) folder by folder,
a folder's file names tested as one string (`str.isascii` costs nothing; only a folder with
non-ASCII names is encoded).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from vacsr.data.fewshot import Item
from vacsr.data.folder_items import ClassFolder, FolderItems
from vacsr.data.listing_cache import SEPARATOR, Names
from vacsr.errors import DataError

# label -> (its class name, the entry that first gave it, e.g. "train[0]")
NamesByLabel = dict[int, tuple[str, str]]


def check_splits(splits: Mapping[str, Sequence[Item] | None], num_classes: int,
                 files: Mapping[str, str], dataset_dir: Path) -> None:
    """Raise DataError for the first entry of any split with a label outside 0..num_classes-1, a
    class name other than the one its label has elsewhere (in any split), an image path already
    listed in its split, or a path or class name that is not valid UTF-8.

    `files`: split -> the file that lists it (named in the error); class-folder splits name the
    folder instead. A split that is None (ImageNet's val) is skipped.
    """
    names: NamesByLabel = {}
    for split, items in splits.items():
        if items is None:
            continue
        if isinstance(items, FolderItems):
            for folder in items.folders:
                _check_folder(folder, split, num_classes, names, dataset_dir)
        else:
            _check_entries(items, split, num_classes, names, files[split])


def _check_entries(items: Sequence[Item], split: str, num_classes: int, names: NamesByLabel,
                   file: str) -> None:
    first_index: dict[str, int] = {}
    for index, item in enumerate(items):
        label, classname = item.label, item.classname
        if not 0 <= label < num_classes:
            raise DataError(f"{file}: {split}[{index}] {item.path!r} has label {label}; "
                            f"expected a label in 0..{num_classes - 1} (the dataset's "
                            f"{num_classes} classes)")
        known = names.get(label)
        if known is None:
            _require_utf8(classname, f"{file}: {split}[{index}] names the class", "class names")
            names[label] = (classname, f"{split}[{index}]")
        elif known[0] != classname:
            raise DataError(f"{file}: {split}[{index}] {item.path!r} names class {classname!r} "
                            f"for label {label}, which {known[1]} names {known[0]!r}; expected "
                            "one class name per label")
        first = first_index.setdefault(item.path, index)
        if first != index:
            raise DataError(f"{file}: {split}[{index}] repeats {item.path!r} of "
                            f"{split}[{first}]; expected each image once in a split")
        if not item.path.isascii():
            _require_utf8(item.path, f"{file}: {split}[{index}] names the path", "image paths")


def _check_folder(folder: ClassFolder, split: str, num_classes: int, names: NamesByLabel,
                  dataset_dir: Path) -> None:
    """A class folder's label and name; its files are unique (one listing), their names UTF-8."""
    where = dataset_dir / folder.prefix
    if not 0 <= folder.label < num_classes:
        raise DataError(f"{where}: class folder number {folder.label + 1}; expected "
                        f"{num_classes} class folders")
    known = names.setdefault(folder.label, (folder.classname, f"{split} folder {where}"))
    if known[0] != folder.classname:
        raise DataError(f"{where}: class {folder.classname!r} for label {folder.label}, which "
                        f"{known[1]} names {known[0]!r}; expected one class name per label")
    listed = folder.names
    joined = listed.joined() if isinstance(listed, Names) else SEPARATOR.join(listed)
    if not joined.isascii():  # a cached listing is checked too: it is what the load uses
        for name in listed:
            if not name.isascii():
                _require_utf8(name, f"{where}: file name", "file names (rename the file)")


def _require_utf8(text: str, what: str, expected: str) -> None:
    """File names that are not UTF-8 reach Python as lone surrogates (os.fsdecode), as do JSON
    escapes such as "\\udcff": they would fail later, when a path or name is written as text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(f"{what} {_raw_bytes(text)!r}, which is not valid UTF-8; expected UTF-8 "
                        f"{expected}") from None


def _raw_bytes(text: str) -> bytes:
    """The bytes a file name had on disk (surrogate escapes back to bytes), else the escapes'."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")
