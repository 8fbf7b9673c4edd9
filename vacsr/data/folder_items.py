"""The items of a class-folder tree (ImageNet's images/train/<wnid>/...) without building them.

ImageNet's train split is 1.28M images, of which a trial uses 16 per class. Building an Item for
each image on every load cost more than reading the cached listing (listing_cache.py); these
sequences build Items only for what is read. Few-shot sampling draws from each class's
`ClassItems` (random.sample reads `len` and the drawn indices), the class count, the few-shot
cache's subset check and ImageNet's val draw from the remaining train images ask the tree directly
(`labels`, `has`, `without`), and iterating yields every Item in
the order a list of them would have.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Iterator, Sequence, overload

from vacsr.data.fewshot import Item


@dataclass(frozen=True)
class ClassFolder:
    """One class folder: its path prefix (relative to the dataset folder), label, name, files."""

    prefix: str  # "images/train/n01440764/"
    label: int
    classname: str
    names: Sequence[str]  # sorted file names (listing_cache.Names)

    def item(self, name: str) -> Item:
        return Item(self.prefix + name, self.label, self.classname)


class _LazySequence(Sequence[Item]):
    """Slices and equality for a sequence that builds Items by index."""

    def _item(self, index: int) -> Item:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> list[Item]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._item(index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable


class ClassItems(_LazySequence):
    """The Items of one class folder."""

    def __init__(self, folder: ClassFolder) -> None:
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder.names)

    def _item(self, index: int) -> Item:
        return self.folder.item(self.folder.names[index])

    def __iter__(self) -> Iterator[Item]:
        return map(self.folder.item, self.folder.names)


class FolderItems(_LazySequence):
    """Every image of a tree's class folders, folder after folder, files in sorted order."""

    def __init__(self, folders: Sequence[ClassFolder]) -> None:
        self.folders = list(folders)
        self._ends = list(accumulate(len(folder.names) for folder in self.folders))
        self._by_prefix = {folder.prefix: folder for folder in self.folders}

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _item(self, index: int) -> Item:
        at = bisect_right(self._ends, index)
        start = self._ends[at - 1] if at else 0
        return self.folders[at].item(self.folders[at].names[index - start])

    def __iter__(self) -> Iterator[Item]:
        for folder in self.folders:
            yield from map(folder.item, folder.names)

    def groups(self) -> dict[int, ClassItems]:
        """Label -> that class's items, labels in order of first occurrence (as group_by_label)."""
        return {folder.label: ClassItems(folder) for folder in self.folders if folder.names}

    def labels(self) -> set[int]:
        return {folder.label for folder in self.folders if folder.names}

    def without(self, paths: set[str]) -> FolderItems:
        """The items whose path is not in `paths`, in the same order; still built on read."""
        dropped: dict[str, set[str]] = defaultdict(set)
        for path in paths:
            prefix, _, name = path.rpartition("/")
            dropped[prefix + "/"].add(name)
        return FolderItems([
            replace(folder, names=[n for n in folder.names if n not in dropped[folder.prefix]])
            if folder.prefix in dropped else folder for folder in self.folders])

    def has(self, path: str, label: int) -> bool:
        """Whether (path, label) is one of the items, found through its folder."""
        prefix, _, name = path.rpartition("/")
        folder = self._by_prefix.get(prefix + "/")
        return folder is not None and folder.label == label and name in folder.names
