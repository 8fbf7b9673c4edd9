"""Few-shot sampling and base/novel splitting, checked against the protocol's reference code."""
from __future__ import annotations

import pickle
import random
import sys
import types
from collections import defaultdict

import pytest

from vacsr.data.fewshot import (
    Item,
    fewshot_path,
    load_or_sample,
    read_fewshot_cache,
    sample_train_val,
    subsample_classes,
    val_from_remaining_train,
)
from vacsr.errors import DataError


def make_items(num_classes: int, per_class: int, prefix: str = "img") -> list[Item]:
    # Interleaved labels (not grouped) so that group order = first-occurrence order matters.
    return [Item(f"{prefix}/{label}_{n}.png", label, f"class_{label}")
            for n in range(per_class) for label in (range(num_classes)[::-1] if n % 2 else
                                                    range(num_classes))]


def dassl_reference(train: list[Item], val: list[Item], shots: int, seed: int):
    """Dassl's generate_fewshot_dataset after set_random_seed, written with the global module."""
    random.seed(seed)
    outputs = []
    for source, k in ((train, shots), (val, min(shots, 4))):
        tracker = defaultdict(list)
        for item in source:
            tracker[item.label].append(item)
        dataset = []
        for items in tracker.values():
            dataset.extend(random.sample(items, k) if len(items) >= k else items)
        outputs.append(dataset)
    return outputs


@pytest.mark.parametrize("shots,seed", [(1, 1), (2, 2), (16, 3)])
def test_sampling_matches_dassl_reference(shots, seed):
    train, val = make_items(7, 20), make_items(7, 6, "val")
    state = random.getstate()
    expected = dassl_reference(train, val, shots, seed)
    random.setstate(state)
    assert list(sample_train_val(train, val, shots, seed)) == expected


def test_shots_per_class_and_fewer_than_k_keeps_all():
    train = make_items(5, 10) + [Item("rare/0.png", 5, "rare")]  # class 5 has a single image
    few_train, few_val = sample_train_val(train, make_items(6, 10, "val"), shots=4, seed=1)
    counts = defaultdict(int)
    for item in few_train:
        counts[item.label] += 1
    assert dict(counts) == {0: 4, 1: 4, 2: 4, 3: 4, 4: 4, 5: 1}
    assert len(few_val) == 6 * 4 and len(set(few_train)) == len(few_train)
    _, few_val16 = sample_train_val(train, make_items(6, 10, "val"), shots=16, seed=1)
    assert len(few_val16) == 6 * 4  # val is min(K, 4) shots


def test_same_seed_same_sample_other_seed_other_sample():
    train, val = make_items(10, 12), make_items(10, 6, "val")
    assert sample_train_val(train, val, 4, 1) == sample_train_val(train, val, 4, 1)
    assert sample_train_val(train, val, 4, 1)[0] != sample_train_val(train, val, 4, 2)[0]


@pytest.mark.parametrize("num_classes,base,novel", [
    (100, 50, 50), (37, 19, 18), (196, 98, 98), (102, 51, 51), (101, 51, 50), (397, 199, 198),
    (47, 24, 23), (10, 5, 5), (1000, 500, 500)])
def test_base_novel_split_and_relabel(num_classes, base, novel):
    # CoOp's convention: base = ceil(n/2) classes, novel = the rest (37 -> 19 base, 18 novel)
    items = make_items(num_classes, 2)
    base_items, = subsample_classes(items, subsample="base")
    novel_items, = subsample_classes(items, subsample="novel")
    assert sorted({i.label for i in base_items}) == list(range(base))
    assert sorted({i.label for i in novel_items}) == list(range(novel))
    # novel label 0 is the first class after the base half, names travel with the relabelling
    assert {i.classname for i in novel_items if i.label == 0} == {f"class_{base}"}
    assert len(base_items) + len(novel_items) == len(items)


def test_subsample_filters_every_split_with_the_train_classes():
    train = make_items(6, 2)
    test = make_items(6, 3, "test")
    base_train, base_test = subsample_classes(train, test, subsample="base")
    assert {i.classname for i in base_test} == {"class_0", "class_1", "class_2"}
    assert len(base_test) == 9 and len(base_train) == 6


def test_cache_written_with_relative_paths_and_reused(tmp_path):
    dataset_dir = tmp_path / "oxford_pets"
    train, val = make_items(4, 8, "images"), make_items(4, 4, "images/val")
    first = load_or_sample(dataset_dir, train, val, shots=2, seed=1)
    path = fewshot_path(dataset_dir, 2, 1)
    assert path.name == "shot_2-seed_1.pkl" and path.parent.name == "split_fewshot"
    stored = pickle.loads(pickle.loads(path.read_bytes())["items"])  # format 2: checksummed
    assert all(not p.startswith("/") for p, _, _ in stored["train"] + stored["val"])
    # Reused as is: a different split order would give another draw if it were resampled.
    assert load_or_sample(dataset_dir, train[::-1], val[::-1], shots=2, seed=1) == first


def test_stale_or_corrupt_cache_is_a_data_error(tmp_path):
    dataset_dir = tmp_path / "dtd"
    train, val = make_items(3, 5), make_items(3, 5, "val")
    load_or_sample(dataset_dir, train, val, shots=2, seed=1)
    with pytest.raises(DataError, match="not in the train split"):
        load_or_sample(dataset_dir, make_items(3, 5, "other"), val, shots=2, seed=1)
    fewshot_path(dataset_dir, 2, 1).write_bytes(b"garbage")
    with pytest.raises(DataError, match="shot_2-seed_1.pkl: unreadable few-shot cache"):
        load_or_sample(dataset_dir, train, val, shots=2, seed=1)


def test_cache_refuses_arbitrary_classes(tmp_path):
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"train": [types.SimpleNamespace()]}))
    with pytest.raises(DataError, match="unexpected object"):
        read_fewshot_cache(path, "dtd")


def test_reads_coop_cache_with_dassl_datum_and_absolute_paths(tmp_path, monkeypatch):
    module = types.ModuleType("dassl.data.datasets.base_dataset")

    class Datum:
        def __init__(self, impath, label, classname):
            self._impath, self._label, self._domain, self._classname = impath, label, 0, classname

    Datum.__module__ = module.__name__
    Datum.__qualname__ = "Datum"
    module.Datum = Datum
    for name in ("dassl", "dassl.data", "dassl.data.datasets", module.__name__):
        monkeypatch.setitem(sys.modules, name, module)
    train = make_items(3, 4, "images")
    chosen = [Datum(f"/old/machine/data/oxford_pets/{i.path}", i.label, i.classname)
              for i in train[:3]]
    payload = pickle.dumps({"train": chosen, "val": chosen[:1]})
    for name in ("dassl", "dassl.data", "dassl.data.datasets", module.__name__):
        monkeypatch.delitem(sys.modules, name)  # reading must not need dassl installed
    path = tmp_path / "shot.pkl"
    path.write_bytes(payload)
    few_train, few_val = read_fewshot_cache(path, "oxford_pets")
    assert few_train == train[:3] and few_val == train[:1]


def test_imagenet_val_comes_from_remaining_train_images():
    train = make_items(5, 10)
    few_train = sample_train_val(train, train, 4, 1)[0]
    val = val_from_remaining_train(train, few_train, 4, 1)
    assert not {i.path for i in val} & {i.path for i in few_train}
    assert len(val) == 5 * 4


def test_read_only_dataset_folder_caches_the_draw_in_the_cache_dir(tmp_path, read_only,
                                                                  monkeypatch):
    from vacsr.data.classification import load_classification
    from vacsr.data.generate import generate_all

    root = generate_all(tmp_path / "data", seed=0, per_class=(3, 3, 1), datasets=["eurosat"])
    monkeypatch.setenv("VACSR_CACHE_DIR", str(tmp_path / "cache"))
    read_only(root)
    first = load_classification(root, "eurosat", shots=2, seed=2, subsample="base")
    from vacsr.data.fewshot import fallback_fewshot_path

    cached = fallback_fewshot_path(root / "eurosat", 2, 2)
    assert cached.is_file() and not fewshot_path(root / "eurosat", 2, 2).exists()
    assert str(cached).startswith(str(tmp_path / "cache" / "fewshot"))
    cached.write_bytes(b"garbage")  # the second load reads the fallback file, not a new draw
    with pytest.raises(DataError, match="unreadable few-shot cache"):
        load_classification(root, "eurosat", shots=2, seed=2, subsample="base")
    cached.unlink()
    again = load_classification(root, "eurosat", shots=2, seed=2, subsample="base")
    assert again["train"].images == first["train"].images
