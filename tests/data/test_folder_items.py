"""Class-folder items built on demand behave exactly as the list of Items they stand for: same
order, same few-shot draw for every seed, same subset check and class count."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from vacsr.data.fewshot import (
    Item,
    _check_subset,
    group_by_label,
    label_set,
    sample_few_shot,
    val_from_remaining_train,
)
from vacsr.data.folder_items import ClassFolder, FolderItems
from vacsr.data.listing_cache import Names
from vacsr.errors import DataError

# Class sizes on both sides of random.sample's switch between copying the population (small
# classes) and drawing indices from it (large ones), and an empty folder whose label is skipped.
SIZES = [3, 40, 0, 85, 86, 300, 1300]


def tree(sizes=SIZES) -> FolderItems:
    rng = random.Random(0)
    folders = []
    for label, size in enumerate(sizes):
        wnid = f"n{label:08d}"
        names = sorted(f"{wnid}_{n}.JPEG" for n in rng.sample(range(100_000), size))
        folders.append(ClassFolder(f"images/train/{wnid}/", label, f"class {label}",
                                   Names("\0".join(names))))
    return FolderItems(folders)


def eager(items: FolderItems) -> list[Item]:
    return [Item(folder.prefix + name, folder.label, folder.classname)
            for folder in items.folders for name in list(folder.names)]


def test_sequence_equals_the_eager_list():
    items, expected = tree(), eager(tree())
    assert len(items) == len(expected) == sum(SIZES)
    assert list(items) == expected and items == expected
    assert [items[i] for i in (0, 2, 3, 42, -1, -len(expected))] == \
        [expected[i] for i in (0, 2, 3, 42, -1, -len(expected))]
    assert items[40:50] == expected[40:50] and items[::97] == expected[::97]
    with pytest.raises(IndexError):
        items[len(expected)]


@pytest.mark.parametrize("shots", [1, 4, 16, 100])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_few_shot_draw_equals_the_eager_draw(shots, seed):
    lazy = sample_few_shot(tree(), shots, random.Random(seed))
    listed = sample_few_shot(eager(tree()), shots, random.Random(seed))
    assert lazy == listed
    assert len(lazy) == sum(min(size, shots) for size in SIZES)


def test_groups_and_labels_match_the_list():
    items = tree()
    assert {label: list(group) for label, group in group_by_label(items).items()} == \
        dict(group_by_label(eager(items)))
    assert list(group_by_label(items)) == [0, 1, 3, 4, 5, 6]  # folder order, empty one skipped
    assert label_set(items) == label_set(eager(items)) == {0, 1, 3, 4, 5, 6}


def test_subset_check_finds_foreign_items():
    items = tree()
    sample = sample_few_shot(items, 4, random.Random(1))
    _check_subset(sample, items, Path("shot_4-seed_1.pkl"), "train")  # drawn from it: passes
    for foreign in (Item("images/train/n00000001/n00000001_missing.JPEG", 1, "class 1"),
                    Item(sample[0].path, sample[0].label + 1, sample[0].classname),
                    Item("images/val/" + sample[0].path.split("/", 2)[2], 0, "class 0")):
        with pytest.raises(DataError, match="is not in the train split"):
            _check_subset([*sample, foreign], items, Path("shot_4-seed_1.pkl"), "train")
        with pytest.raises(DataError, match="is not in the train split"):  # the list path agrees
            _check_subset([*sample, foreign], eager(items), Path("shot_4-seed_1.pkl"), "train")


@pytest.mark.parametrize("seed", [1, 2])
def test_val_from_the_remaining_train_images_equals_the_eager_draw(seed):
    """ImageNet's few-shot val (no val split): drawn from the train images not in the train draw."""
    items = tree()
    few_train = sample_few_shot(items, 16, random.Random(seed))
    chosen = {item.path for item in few_train}
    assert items.without(chosen) == [item for item in eager(items) if item.path not in chosen]
    lazy = val_from_remaining_train(items, few_train, 16, seed)
    assert lazy == val_from_remaining_train(eager(items), few_train, 16, seed)
    assert not chosen & {item.path for item in lazy}
