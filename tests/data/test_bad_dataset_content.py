"""Bad dataset content (labels, class names, repeated entries, file names that are not UTF-8,
decompression bombs) ends in one `vacsr: error:` line naming the file and the entry, exit status
2, and nothing written, for every split and every reader; a cached listing or few-shot sample
cannot bring it back."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import time
import zlib
from pathlib import Path

import pytest

from conftest import nothing_written
from vacsr.cli import main
from vacsr.data.classification import load_classification
from vacsr.data.fewshot import Item, fewshot_path, write_fewshot_cache
from vacsr.data.folder_items import ClassFolder, FolderItems
from vacsr.data.listing_cache import Names, cache_paths
from vacsr.data.validate import check_splits
from vacsr.errors import DataError

TRAIN = ["train", "data.task=classification", "data.shots=1", "model.use_gpo=false",
         "train.batch_size=4", "train.epochs=1", "train.progress=false", "train.device=cpu",
         "adapter.hidden_dim=16"]
CALTECH_SPLIT = Path("caltech-101") / "split_zhou_Caltech101.json"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    from vacsr.data.generate import generate_all

    return generate_all(tmp_path_factory.mktemp("data"),
                        datasets=["caltech101", "fgvc_aircraft", "imagenet"], per_class=(2, 1, 1))


@pytest.fixture
def root(pristine, tmp_path) -> Path:
    shutil.copytree(pristine, tmp_path / "data", symlinks=True)
    return tmp_path / "data"


def _train(root: Path, dataset: str, run: Path, weights: Path, capsys) -> str:
    """The one stderr line of a `vacsr train` that must fail with exit status 2."""
    code = main([*TRAIN, f"model.pretrained={weights}", f"data.dataset={dataset}",
                 f"data.root={root}", f"train.output_dir={run}"])
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("vacsr: error: "), lines
    return lines[0]


def _edit_split(root: Path, edit) -> Path:
    path = root / CALTECH_SPLIT
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


# ---------------------------------------------------------------- 1: labels outside the classes
@pytest.mark.parametrize("split,label", [("test", 100), ("val", -1), ("train", 100)])
def test_split_label_outside_the_classes(root, tmp_path, weights, capsys, split, label):
    def edit(data):
        data[split][1][1] = label

    path = _edit_split(root, edit)
    line = _train(root, "caltech101", tmp_path / "run", weights, capsys)
    assert f"{path}: {split}[1] " in line
    assert f"has label {label}; expected a label in 0..99 (the dataset's 100 classes)" in line
    nothing_written(tmp_path / "run")


def test_aircraft_label_outside_the_classes(root, tmp_path, weights, capsys):
    """Aircraft's labels are lines of variants.txt: a 101st variant is label 100 of 100 classes."""
    dataset_dir = root / "fgvc_aircraft"
    with open(dataset_dir / "variants.txt", "a") as handle:
        handle.write("Extra-variant\n")
    test_list = dataset_dir / "images_variant_test.txt"
    lines = test_list.read_text().splitlines()
    lines[2] = lines[2].split(" ")[0] + " Extra-variant"
    test_list.write_text("\n".join(lines) + "\n")
    line = _train(root, "fgvc_aircraft", tmp_path / "run", weights, capsys)
    assert f"{test_list}: test[2] " in line and "has label 100; expected a label in 0..99" in line
    nothing_written(tmp_path / "run")


def test_bad_data_is_refused_before_the_model_is_built(root, tmp_path, monkeypatch):
    """`vacsr train` checks the data before it builds a model (seconds, and open_clip's note
    that no pretrained weights were loaded): the whole stderr of the command is its one line."""
    import subprocess
    import sys

    from vacsr.train import loop

    def edit(data):
        data["test"][1][1] = 100

    path = _edit_split(root, edit)
    argv = [*TRAIN, "data.dataset=caltech101", f"data.root={root}",
            f"train.output_dir={tmp_path / 'run'}"]  # no weights: open_clip would say so
    out = subprocess.run([sys.executable, "-m", "vacsr.cli", *argv], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"vacsr: error: {path}: test[1] ")

    def no_model(config):
        raise AssertionError("the model was built before the data was checked")

    monkeypatch.setattr(loop, "build_model", no_model)
    assert main(argv) == 2
    nothing_written(tmp_path / "run")


# ---------------------------------------------------------------- 2: one class name per label
@pytest.mark.parametrize("split", ["train", "test"])  # within the train split, across splits
def test_two_class_names_for_one_label(root, tmp_path, weights, capsys, split):
    def edit(data):
        entries = data[split][1:] if split == "train" else data[split]
        entry = next(e for e in entries if e[1] == data["train"][0][1])
        entry[2] = "not the same class"

    path = _edit_split(root, edit)
    line = _train(root, "caltech101", tmp_path / "run", weights, capsys)
    assert f"{path}: {split}[" in line
    assert "names class 'not the same class' for label 0, which train[0] names 'airplane'" in line
    assert line.endswith("expected one class name per label")
    nothing_written(tmp_path / "run")


# ---------------------------------------------------------------- 3: an image listed twice
def test_image_listed_twice_in_a_split(root, tmp_path, weights, capsys):
    def edit(data):
        data["test"].append(list(data["test"][3]))

    path = _edit_split(root, edit)
    count = len(json.loads(path.read_text())["test"])
    line = _train(root, "caltech101", tmp_path / "run", weights, capsys)
    assert f"{path}: test[{count - 1}] repeats '101_ObjectCategories/" in line
    assert "of test[3]; expected each image once in a split" in line
    nothing_written(tmp_path / "run")


# ---------------------------------------------------------------- 4: names that are not UTF-8
def test_class_folder_file_name_not_utf8(root, tmp_path, weights, capsys):
    folder = sorted((root / "imagenet" / "images" / "train").iterdir())[3]
    first = sorted(folder.iterdir())[0]
    os.rename(bytes(first), bytes(folder) + b"/bad\xff\xfe.png")
    line = _train(root, "imagenet", tmp_path / "run", weights, capsys)
    assert f"{folder}: file name b'bad\\xff\\xfe.png', which is not valid UTF-8" in line
    assert line.endswith("expected UTF-8 file names (rename the file)")
    nothing_written(tmp_path / "run")


def test_split_path_not_utf8(root, tmp_path, weights, capsys):
    """A JSON escape can name a lone surrogate: the bytes a non-UTF-8 file name decodes to."""
    def edit(data):
        data["val"][2][0] = data["val"][2][0].replace(".png", "\udcff.png")

    path = _edit_split(root, edit)
    line = _train(root, "caltech101", tmp_path / "run", weights, capsys)
    assert f"{path}: val[2] names the path b'101_ObjectCategories/" in line
    assert "\\xff.png', which is not valid UTF-8; expected UTF-8 image paths" in line
    nothing_written(tmp_path / "run")


# ---------------------------------------------------------------- 5: decompression bombs
def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height: a few bytes a decoder would inflate to GBs."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                              0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


@pytest.mark.parametrize("width,height,size", [
    (10_000, 9_000, "10000x9000, 90.0 Mpx"),  # over the limit: PIL would only warn
    (20_000, 20_000, "400.0 Mpx"),  # over twice PIL's limit: PIL's DecompressionBombError
])
def test_decompression_bomb(root, tmp_path, weights, capsys, width, height, size):
    bomb = _png_header_only(width, height)
    images = sorted((root / "caltech-101" / "101_ObjectCategories").rglob("*.png"))
    for image in images:  # whichever the few-shot draw reads first
        image.write_bytes(bomb)
    line = _train(root, "caltech101", tmp_path / "run", weights, capsys)
    assert line.startswith(f"vacsr: error: {root / 'caltech-101' / '101_ObjectCategories'}/")
    assert f".png: image of {size} is too large to decode; expected at most 89.5 Mpx" in line
    # the run's resolved config is saved before the first batch; no checkpoint, no metrics
    assert [p.name for p in (tmp_path / "run").iterdir()] in ([], ["config.yaml"])


# ---------------------------------------------------------------- caches do not bring it back
def _age(folder: Path) -> None:
    """Folders old enough for the listing cache to trust their fingerprints."""
    past = time.time() - 3600
    for path in [folder, *(p for p in folder.iterdir() if p.is_dir())]:
        os.utime(path, (past, past))


def test_cached_listing_is_checked_too(root):
    """A cached listing whose names were not checked when written (an older vacsr) is refused."""
    train = root / "imagenet" / "images" / "train"
    _age(train)
    _age(root / "imagenet" / "images" / "val")
    load_classification(root, "imagenet", shots=1, seed=1)  # writes the listing cache
    cache = next(p for p in cache_paths(train.resolve()) if p.is_file())
    data = pickle.loads(cache.read_bytes())
    folder = sorted(data["folders"])[5]
    fingerprint, joined, count = data["folders"][folder]
    data["folders"][folder] = (fingerprint, joined + "\0z\udcff.png", count + 1)
    cache.write_bytes(pickle.dumps(data))
    with pytest.raises(DataError) as info:
        load_classification(root, "imagenet", shots=1, seed=1)
    assert str(info.value) == (f"{train / folder}: file name b'z\\xff.png', which is not valid "
                               "UTF-8; expected UTF-8 file names (rename the file)")


@pytest.mark.parametrize("damage", ["class name", "twice"])
def test_cached_few_shot_sample_is_checked_too(root, damage):
    dataset_dir = root / "caltech-101"
    split = json.loads((dataset_dir / CALTECH_SPLIT.name).read_text())
    train = [Item(f"101_ObjectCategories/{p}", label, name) for p, label, name in split["train"]]
    val = [Item(f"101_ObjectCategories/{p}", label, name) for p, label, name in split["val"]]
    sample = train[::2]
    if damage == "class name":
        sample[1] = Item(sample[1].path, sample[1].label, "another name")
    else:
        sample.append(sample[4])
    cache = write_fewshot_cache(fewshot_path(dataset_dir, 1, 1), sample, val[::3])
    with pytest.raises(DataError) as info:
        load_classification(root, "caltech101", shots=1, seed=1)
    message = str(info.value)
    assert message.startswith(f"{cache}: cached item '101_ObjectCategories/")
    assert ("(label 1, class 'another name') is not in the train split" in message
            if damage == "class name" else "is in the train sample twice" in message)


# ---------------------------------------------------------------- the validator itself
def _folders(*specs: tuple[int, str, list[str]]) -> FolderItems:
    return FolderItems([ClassFolder(f"images/train/n{label:02d}/", label, name,
                                    Names("\0".join(files)))
                        for label, name, files in specs])


def test_validator_accepts_good_splits_of_every_shape(tmp_path):
    items = [Item(f"a/{n}.png", n % 3, f"class {n % 3}") for n in range(9)]
    check_splits({"train": items, "val": None, "test": items[:4]}, 3,
                 {"train": "split.json", "test": "split.json"}, tmp_path)
    check_splits({"train": _folders((0, "x", ["1.png", "é.png"]), (1, "y", []))}, 2, {}, tmp_path)


@pytest.mark.parametrize("folders,fragment", [
    (((0, "x", ["1.png"]), (2, "z", ["2.png"])), "n02: class folder number 3; expected 2 class "
                                                 "folders"),
    (((0, "x", ["1.png"]), (1, "y", ["2\udc80.png"])), "n01: file name b'2\\x80.png', which is "
                                                      "not valid UTF-8"),
])
def test_validator_refuses_class_folders(tmp_path, folders, fragment):
    with pytest.raises(DataError, match=None) as info:
        check_splits({"test": _folders(*folders)}, 2, {}, tmp_path)
    assert fragment in str(info.value) and str(tmp_path / "images" / "train") in str(info.value)


def test_validator_refuses_a_folder_name_other_than_the_list_name(tmp_path):
    """A label named by a list split and a class-folder split must agree."""
    with pytest.raises(DataError, match="class 'y' for label 0, which train\\[0\\] names 'x'"):
        check_splits({"train": [Item("a.png", 0, "x")], "test": _folders((0, "y", ["b.png"]))},
                     1, {"train": "split.json"}, tmp_path)
