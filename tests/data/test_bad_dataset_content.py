"""Bad dataset content ends in one `vacsr: error:` line naming the file and the entry, exit
status 2, and nothing written, for every split and every reader: labels outside the classes, two
class names for a label, repeated entries, file names that are not UTF-8, decompression bombs,
paths outside the dataset folder, link loops, crafted few-shot caches. A cached listing or
few-shot sample cannot bring it back. Below the command, each loader refuses a missing or
malformed dataset file in one clear vacsr error naming the path and what was expected, no deep
traceback."""
from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import struct
import time
import zlib
from pathlib import Path

import pytest

from conftest import nothing_written, one_line, refused
from vacsr.cli import main
from vacsr.config import DataConfig
from vacsr.data import build_classification, build_retrieval
from vacsr.data.base import load_image
from vacsr.data.classification import load_classification
from vacsr.data.coco import load_coco
from vacsr.data.datasets import LabelledImageDataset
from vacsr.data.fewshot import Item, fewshot_path, read_fewshot_cache, write_fewshot_cache
from vacsr.data.folder_items import ClassFolder, FolderItems
from vacsr.data.generate import (
    write_aircraft,
    write_coco,
    write_imagenet_variant,
    write_split_dataset,
)
from vacsr.data.listing_cache import Names, cache_paths
from vacsr.data.validate import check_splits
from vacsr.errors import ConfigError, DataError, VacsrError

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
    """A private copy of `pristine` each test may damage."""
    shutil.copytree(pristine, tmp_path / "data", symlinks=True)
    return tmp_path / "data"


def _train(root: Path, dataset: str, run: Path, weights: Path, capsys) -> str:
    """The one stderr line of a `vacsr train` that must fail with exit status 2."""
    return one_line([*TRAIN, f"model.pretrained={weights}", f"data.dataset={dataset}",
                     f"data.root={root}", f"train.output_dir={run}"], capsys)


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
    assert refused(out).startswith(f"vacsr: error: {path}: test[1] ")

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


# ---------------------------------------------------------------- 6: paths out, link loops
def test_split_entry_outside_the_dataset_folder(root, tmp_path, weights, capsys):
    split = root / "caltech-101" / "split_zhou_Caltech101.json"
    data = json.loads(split.read_text())
    (tmp_path / "outside").mkdir()
    shutil.copy(root / "caltech-101" / "101_ObjectCategories" / data["test"][0][0],
                tmp_path / "outside" / "x.png")
    data["test"][0][0] = "../../../outside/x.png"
    split.write_text(json.dumps(data))
    line = _train(root, "caltech101", tmp_path / "run", weights, capsys)
    assert f"{split}: test[0] names '../../../outside/x.png', outside the dataset folder" in line
    assert (tmp_path / "run" / "last.ckpt").exists() is False


@pytest.mark.parametrize("where", ["class-folder", "entry"])
def test_symlink_loop_in_a_class_folder_tree(root, tmp_path, weights, capsys, where):
    train = root / "imagenet" / "images" / "train"
    first = sorted(train.iterdir())[0]
    loop = train / "n00000001" if where == "class-folder" else first / "loop.png"
    os.symlink(loop.name, loop)  # a link to itself
    line = _train(root, "imagenet", tmp_path / "run", weights, capsys)
    assert f"{loop}: symbolic link loop" in line
    nothing_written(tmp_path / "run")


# ---------------------------------------------------------------- 7: few-shot caches
def _datum_cache(entries: list, state_of=lambda entry: entry) -> bytes:
    """A CoOp-style cache: pickled dassl Datum objects (module renamed after pickling)."""
    payload = pickle.dumps({"train": [_Datum(state_of(e)) for e in entries]}, protocol=2)
    return payload.replace(f"c{__name__}\n_Datum".encode(), b"cdassl.data\nDatum")


class _Datum:
    def __init__(self, state):
        self.state = state

    def __reduce__(self):
        return _Datum, (None,), self.state


def test_crafted_datum_cache_is_one_line(root, tmp_path, weights, capsys):
    cache = root / "caltech-101" / "split_fewshot" / "shot_1-seed_1.pkl"
    cache.parent.mkdir()
    cache.write_bytes(_datum_cache([0], state_of=lambda _: [1, 2]))  # a state that is no dict
    line = _train(root, "caltech101", tmp_path / "run", weights, capsys)
    assert f"{cache}: unreadable few-shot cache" in line and "delete the file" in line
    nothing_written(tmp_path / "run")


def test_fuzzed_caches_load_or_raise_data_error(tmp_path):
    """Seeded mutations of a vacsr and a CoOp cache: each loads, or is one DataError line."""
    items = [Item(f"images/c{i}/img_{j}.jpg", i, f"class {i}") for i in range(4) for j in range(2)]
    write_fewshot_cache(tmp_path / "vacsr.pkl", items, items[:4])
    sources = [(tmp_path / "vacsr.pkl").read_bytes(), _datum_cache(
        [{"_impath": f"/x/oxford_pets/images/a_{i}.jpg", "_label": i, "_classname": "a"}
         for i in range(4)])]
    assert read_fewshot_cache(tmp_path / "vacsr.pkl", "oxford_pets")[0] == items
    rng, path, outcomes = random.Random(0), tmp_path / "mutated.pkl", {"loaded": 0, "refused": 0}
    for n in range(400):
        data = bytearray(sources[n % 2])
        for _ in range(rng.randint(1, 3)):
            at, kind = rng.randrange(len(data)), rng.randrange(3)
            if kind == 0:
                data[at] ^= 1 << rng.randrange(8)
            elif kind == 1:
                data.insert(at, rng.randrange(256))
            else:
                del data[at:at + rng.randint(1, 8)]
        path.write_bytes(bytes(data))
        try:
            train, val = read_fewshot_cache(path, "oxford_pets")
        except DataError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc)
            outcomes["refused"] += 1
        else:
            assert all(isinstance(item, Item) for item in train + (val or []))
            outcomes["loaded"] += 1
    assert outcomes["refused"] > 300, outcomes


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


# ---------------------------------------------------------------- each loader's files
@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> Path:
    """The layouts the loader-level tests damage, each written by its own writer."""
    tree = tmp_path_factory.mktemp("pristine")
    write_split_dataset(tree, "oxford_pets")
    write_aircraft(tree)
    write_coco(tree)
    write_imagenet_variant(tree, "imagenet_a")
    return tree


@pytest.fixture
def tree(layouts, tmp_path) -> Path:
    """A private copy of `layouts` each test may damage."""
    shutil.copytree(layouts, tmp_path / "data")
    return tmp_path / "data"


def raises_one_line(error_type, function, *args, **kwargs) -> str:
    with pytest.raises(error_type) as info:
        function(*args, **kwargs)
    message = str(info.value)
    assert isinstance(info.value, VacsrError) and "\n" not in message
    assert info.value.__suppress_context__ or info.value.__cause__ is None
    return message


def pets(tree):
    return load_classification(tree, "oxford_pets", shots=2, seed=1)


def test_missing_dataset_folder(tmp_path):
    message = raises_one_line(DataError, load_classification, tmp_path, "oxford_pets", shots=2,
                              seed=1)
    assert str(tmp_path / "oxford_pets") in message and "expected" in message
    assert "split_zhou_OxfordPets.json" in message


def test_missing_split_file(tree):
    (tree / "oxford_pets" / "split_zhou_OxfordPets.json").unlink()
    message = raises_one_line(DataError, pets, tree)
    assert "split_zhou_OxfordPets.json: file not found; expected a JSON object" in message


def test_malformed_split_json(tree):
    (tree / "oxford_pets" / "split_zhou_OxfordPets.json").write_text('{"train": [["a.png", 0')
    message = raises_one_line(DataError, pets, tree)
    assert "split_zhou_OxfordPets.json: not valid JSON (line 1" in message


@pytest.mark.parametrize("content,fragment", [
    ({"train": [["a.png", "zero", "cat"]], "val": [["a.png", 0, "cat"]],
      "test": [["a.png", 0, "cat"]]}, "train[0] is ['a.png', 'zero', 'cat']; expected [image path"),
    ({"train": [["a.png", 0, "cat"]], "test": [["a.png", 0, "cat"]]}, "no non-empty 'val' list"),
    ([1, 2], "top level is a list; expected"),
])
def test_split_json_with_wrong_structure(tree, content, fragment):
    (tree / "oxford_pets" / "split_zhou_OxfordPets.json").write_text(json.dumps(content))
    assert fragment in raises_one_line(DataError, pets, tree)


def test_split_entry_pointing_at_missing_image(tree):
    split = json.loads((tree / "oxford_pets" / "split_zhou_OxfordPets.json").read_text())
    missing = tree / "oxford_pets" / "images" / split["test"][3][0]
    missing.unlink()
    message = raises_one_line(DataError, pets, tree)
    assert message.startswith(f"{missing}: image file not found (listed in ")
    assert "split_zhou_OxfordPets.json" in message


def test_wrong_class_count(tree):
    path = tree / "oxford_pets" / "split_zhou_OxfordPets.json"
    split = json.loads(path.read_text())
    split["train"] = [e for e in split["train"] if e[1] != 36]  # a partial download
    path.write_text(json.dumps(split))
    assert "found 36 classes in the train split; expected 37" in raises_one_line(DataError, pets,
                                                                                 tree)


def test_unreadable_image(tree):
    data = pets(tree)["train"]
    Path(data.images[0]).write_bytes(b"not a png at all")
    with pytest.raises(DataError, match=f"{data.images[0]}: unreadable image"):
        LabelledImageDataset(data, lambda image: image)[0]
    with pytest.raises(DataError, match="image file not found"):
        load_image(tree / "nothing.png")


def test_unknown_dataset_name(tree):
    cfg = DataConfig(task="classification", dataset="oxford_petz", root=str(tree))
    message = raises_one_line(ConfigError, build_classification, cfg, 1)
    assert "data.dataset: unknown classification dataset 'oxford_petz'" in message
    assert "oxford_pets" in message  # lists the known names
    cfg = DataConfig(dataset="flickr30k", root=str(tree))
    assert "unknown retrieval dataset 'flickr30k'" in raises_one_line(ConfigError, build_retrieval,
                                                                      cfg, 1)
    with pytest.raises(ConfigError, match="data.root"):
        build_retrieval(DataConfig(dataset="coco"), 1)


def test_aircraft_bad_files(tree):
    variants = tree / "fgvc_aircraft" / "variants.txt"
    text = variants.read_text()
    variants.write_text("\n".join(text.splitlines()[1:]))  # first variant no longer listed
    message = raises_one_line(DataError, load_classification, tree, "fgvc_aircraft", shots=1,
                              seed=1)
    assert "images_variant_train.txt: line 1 names variant" in message and "variants.txt" in message
    variants.unlink()
    assert "variants.txt: file not found; expected one aircraft variant name per line" in \
        raises_one_line(DataError, load_classification, tree, "fgvc_aircraft", shots=1, seed=1)


def test_imagenet_variant_bad_layout(tree):
    image_dir = tree / "imagenet-adversarial" / "imagenet-a"
    shutil.rmtree(image_dir / sorted(p.name for p in image_dir.iterdir() if p.is_dir())[0])
    message = raises_one_line(DataError, load_classification, tree, "imagenet_a", shots=1, seed=1)
    assert f"{image_dir}: found 199 class folders; expected 200" in message
    (tree / "imagenet-adversarial" / "classnames.txt").write_text("n0000 \n")
    assert "has no class name" in raises_one_line(DataError, load_classification, tree,
                                                  "imagenet_a", shots=1, seed=1)
    (tree / "imagenet-adversarial" / "classnames.txt").unlink()
    assert "classnames.txt: file not found" in raises_one_line(
        DataError, load_classification, tree, "imagenet_a", shots=1, seed=1)


def test_coco_bad_inputs(tree):
    json_path = tree / "coco" / "dataset_coco.json"
    data = json.loads(json_path.read_text())
    entry = data["images"][2]
    missing = tree / "coco" / "images" / entry["filepath"] / entry["filename"]
    missing.unlink()
    assert raises_one_line(DataError, load_coco, tree).startswith(
        f"{missing}: image file not found")
    data["images"][1]["sentences"] = data["images"][1]["sentences"][:3]
    json_path.write_text(json.dumps(data))
    assert "images[1] (cocoid" in raises_one_line(DataError, load_coco, tree)
    del data["images"][0]["cocoid"]
    json_path.write_text(json.dumps(data))
    assert "images[0]: missing or malformed field (KeyError" in raises_one_line(DataError,
                                                                               load_coco, tree)
    json_path.write_text("[]")
    assert "no non-empty 'images' list" in raises_one_line(DataError, load_coco, tree)
    json_path.unlink()
    assert "dataset_coco.json: file not found" in raises_one_line(DataError, load_coco, tree)
    shutil.rmtree(tree / "coco")
    assert f"{tree / 'coco'}: folder not found" in raises_one_line(DataError, load_coco, tree)
