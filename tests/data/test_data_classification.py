"""Every classification loader on generated data in its real layout (paper appendix C.1)."""
from __future__ import annotations

import pickle
import shutil
from collections import Counter
from pathlib import Path

import pytest

from vacsr.config import DataConfig
from vacsr.data import build_classification
from vacsr.data.classification import load_classification
from vacsr.data.fewshot import fewshot_path
from vacsr.data.generate import generate_all, imagenet_classnames
from vacsr.data.imagenet import read_variant

# name -> (real classes, base, novel, template); written out, not computed, on purpose
EXPECTED = {
    "caltech101": (100, 50, 50, "a photo of a {}."),
    "oxford_pets": (37, 19, 18, "a photo of a {}, a type of pet."),
    "stanford_cars": (196, 98, 98, "a photo of a {}."),
    "oxford_flowers": (102, 51, 51, "a photo of a {}, a type of flower."),
    "food101": (101, 51, 50, "a photo of {}, a type of food."),
    "fgvc_aircraft": (100, 50, 50, "a photo of a {}, a type of aircraft."),
    "sun397": (397, 199, 198, "a photo of a {}."),
    "dtd": (47, 24, 23, "{} texture."),
    "eurosat": (10, 5, 5, "a centered satellite photo of {}."),
    "ucf101": (101, 51, 50, "a photo of a person doing {}."),
    "imagenet": (1000, 500, 500, "a photo of a {}."),
}
VARIANTS = {"imagenetv2": 1000, "imagenet_sketch": 1000, "imagenet_a": 200, "imagenet_r": 200}
SHOTS = 2


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    # 3 train images per class: a 2-shot draw still has 3 choices per class, so seeds differ
    return generate_all(tmp_path_factory.mktemp("data"), seed=0, per_class=(3, 3, 1),
                        datasets=list(EXPECTED) + list(VARIANTS))


def per_class(labels) -> set[int]:
    return set(Counter(labels).values())


@pytest.mark.parametrize("name", list(EXPECTED))
def test_base_novel_protocol(root, name):
    classes, base, novel, template = EXPECTED[name]
    splits = load_classification(root, name, shots=SHOTS, seed=1, subsample="base")
    assert set(splits) == {"train", "val", "test"}
    for split in splits.values():
        assert len(split.classnames) == base and split.template == template
        assert set(split.labels) == set(range(base))  # relabelled 0..k-1, every class present
        assert all(Path(p).is_file() for p in split.images[:5])
    assert per_class(splits["train"].labels) == {SHOTS}
    assert per_class(splits["val"].labels) == {min(SHOTS, 4)}
    novel_splits = load_classification(root, name, shots=SHOTS, seed=1, subsample="novel")
    assert set(novel_splits) == {"val", "test"}
    assert len(novel_splits["test"].classnames) == novel
    assert set(novel_splits["test"].labels) == set(range(novel))
    everything = load_classification(root, name, shots=SHOTS, seed=1, subsample="all")
    names = everything["train"].classnames
    assert len(names) == classes
    assert names[:base] == splits["train"].classnames and names[base:] == \
        novel_splits["test"].classnames
    assert splits["test"].prompts()[0] == template.format(names[0].replace("_", " "))


@pytest.mark.parametrize("name", ["oxford_pets", "fgvc_aircraft", "imagenet"])
def test_seeds_reproduce_and_differ(root, name):
    one = load_classification(root, name, shots=SHOTS, seed=1, subsample="all")
    again = load_classification(root, name, shots=SHOTS, seed=1, subsample="all")
    other = load_classification(root, name, shots=SHOTS, seed=2, subsample="all")
    assert one["train"].images == again["train"].images
    assert one["val"].images == again["val"].images
    assert one["train"].images != other["train"].images
    assert fewshot_path(root / ("imagenet" if name == "imagenet" else name), SHOTS, 2).is_file()


def test_fewshot_cache_is_relative_and_survives_a_move(root, tmp_path):
    first = load_classification(root, "dtd", shots=SHOTS, seed=3, subsample="base")
    wrapper = pickle.loads(fewshot_path(root / "dtd", SHOTS, 3).read_bytes())  # format 2
    stored = pickle.loads(wrapper["items"])
    assert all(path.startswith("images/") for path, _, _ in stored["train"])
    moved = tmp_path / "moved"
    shutil.copytree(root / "dtd", moved / "dtd")
    second = load_classification(moved, "dtd", shots=SHOTS, seed=3, subsample="base")
    assert [Path(p).relative_to(moved) for p in second["train"].images] == \
        [Path(p).relative_to(root) for p in first["train"].images]


def test_imagenet_val_is_not_test(root):
    splits = load_classification(root, "imagenet", shots=SHOTS, seed=1, subsample="all")
    assert not set(splits["val"].images) & set(splits["test"].images)
    assert not set(splits["val"].images) & set(splits["train"].images)
    assert all("/images/train/" in p for p in splits["val"].images)
    assert splits["train"].classnames == imagenet_classnames()  # names from classnames.txt


def test_class_name_conventions(root):
    eurosat = load_classification(root, "eurosat", shots=1, seed=1, subsample="all")
    assert eurosat["test"].classnames[0] == "Annual Crop Land"  # CoOp's rename, folder AnnualCrop
    assert "/2750/AnnualCrop/" in eurosat["test"].images[0]
    caltech = load_classification(root, "caltech101", shots=1, seed=1, subsample="all")
    assert caltech["test"].classnames[:4] == ["airplane", "face", "leopard", "motorbike"]
    assert "BACKGROUND_Google" not in caltech["test"].classnames
    aircraft = load_classification(root, "fgvc_aircraft", shots=1, seed=1, subsample="all")
    variants = (root / "fgvc_aircraft" / "variants.txt").read_text().splitlines()
    assert aircraft["test"].classnames == variants and "/" in variants[0] and " " in variants[-1]
    sun = load_classification(root, "sun397", shots=1, seed=1, subsample="all")
    assert sun["test"].classnames[0] == "left red_circle"  # "r/red_circle/left", reversed
    assert sun["test"].prompts()[0] == "a photo of a left red circle."
    ucf = load_classification(root, "ucf101", shots=1, seed=1, subsample="all")
    assert ucf["test"].prompts()[0] == "a photo of a person doing Red Circle Left."


@pytest.mark.parametrize("name,classes", list(VARIANTS.items()))
def test_imagenet_variants(root, name, classes):
    splits = load_classification(root, name, shots=SHOTS, seed=1, subsample="base")
    assert set(splits) == {"test"}
    test = splits["test"]
    assert len(test.classnames) == classes and set(test.labels) == set(range(classes))
    ids = read_variant(root, name)[3]  # ImageNet-1k index of each variant label
    all_names = imagenet_classnames()
    # each variant class maps to the ImageNet class of the same name
    assert [all_names[i] for i in ids] == test.classnames
    if classes == 1000:
        assert ids == list(range(1000))
    else:
        assert ids == list(range(0 if name == "imagenet_a" else 1, 1000, 5))


def test_a_smaller_imagenet_has_the_classes_of_its_classnames_and_its_variants_their_share(
        tmp_path):
    """An ImageNet of 100 classes (a subset in the same layout) is read whole; V2 and Sketch have
    all 100, A and R a fifth, as 1,000 / 200 of ImageNet-1k; a missing class is still refused."""
    from vacsr.data.classification import check_dataset_files
    from vacsr.data.generate import write_imagenet, write_imagenet_variant
    from vacsr.errors import DataError

    write_imagenet(tmp_path, classes=100, train_per_class=4, test_per_class=1)
    for name in VARIANTS:
        write_imagenet_variant(tmp_path, name, classes=100)
    assert len(check_dataset_files(tmp_path, "imagenet")) == 100
    splits = load_classification(tmp_path, "imagenet", shots=1, seed=1, subsample="all")
    assert len(splits["train"].classnames) == 100 and len(splits["test"].labels) == 100
    assert {name: len(load_classification(tmp_path, name, shots=1, seed=1)["test"].classnames)
            for name in VARIANTS} == {name: count // 10 for name, count in VARIANTS.items()}
    image_dir = tmp_path / "imagenet-rendition" / "imagenet-r"
    shutil.rmtree(next(p for p in image_dir.iterdir() if p.is_dir()))
    with pytest.raises(DataError, match=f"{image_dir}: found 19 class folders; expected 20"):
        load_classification(tmp_path, "imagenet_r", shots=1, seed=1)
    images = tmp_path / "imagenet" / "images"
    first = sorted(p.name for p in (images / "train").iterdir())[0]
    for split in ("train", "val"):
        shutil.rmtree(images / split / first)
    with pytest.raises(DataError, match="found 99 classes in the train split; expected 100"):
        check_dataset_files(tmp_path, "imagenet")


def test_classnames_fall_back_to_imagenet_folder(root, tmp_path):
    shutil.copytree(root / "imagenet-rendition", tmp_path / "imagenet-rendition")
    (tmp_path / "imagenet-rendition" / "classnames.txt").unlink()
    (tmp_path / "imagenet").mkdir()
    shutil.copy(root / "imagenet" / "classnames.txt", tmp_path / "imagenet" / "classnames.txt")
    test = load_classification(tmp_path, "imagenet_r", shots=1, seed=1)["test"]
    assert len(test.classnames) == 200


def test_build_classification_dispatches_on_root(root):
    cfg = DataConfig(task="classification", dataset="oxford_pets", root=str(root), shots=SHOTS,
                     subsample_classes="base")
    splits = build_classification(cfg, seed=1)
    assert len(splits["train"].classnames) == 19 and len(splits["train"].labels) == 19 * SHOTS
    synthetic = build_classification(DataConfig(task="classification", shots=2), seed=1)
    assert set(synthetic) == {"train", "val", "test"}
