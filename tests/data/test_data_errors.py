"""Bad input: one clear vacsr error naming the path and what was expected, no deep traceback."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vacsr.config import DataConfig
from vacsr.data import build_classification, build_retrieval
from vacsr.data.base import load_image
from vacsr.data.classification import load_classification
from vacsr.data.coco import load_coco
from vacsr.data.datasets import LabelledImageDataset
from vacsr.data.generate import (
    write_aircraft,
    write_coco,
    write_imagenet_variant,
    write_split_dataset,
)
from vacsr.errors import ConfigError, DataError, VacsrError


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    write_split_dataset(root, "oxford_pets")
    write_aircraft(root)
    write_coco(root)
    write_imagenet_variant(root, "imagenet_a")
    return root


@pytest.fixture
def root(pristine, tmp_path) -> Path:
    """A private copy each test may damage."""
    shutil.copytree(pristine, tmp_path / "data")
    return tmp_path / "data"


def raises_one_line(error_type, function, *args, **kwargs) -> str:
    with pytest.raises(error_type) as info:
        function(*args, **kwargs)
    message = str(info.value)
    assert isinstance(info.value, VacsrError) and "\n" not in message
    assert info.value.__suppress_context__ or info.value.__cause__ is None
    return message


def pets(root):
    return load_classification(root, "oxford_pets", shots=2, seed=1)


def test_missing_dataset_folder(tmp_path):
    message = raises_one_line(DataError, load_classification, tmp_path, "oxford_pets", shots=2,
                              seed=1)
    assert str(tmp_path / "oxford_pets") in message and "expected" in message
    assert "split_zhou_OxfordPets.json" in message


def test_missing_split_file(root):
    (root / "oxford_pets" / "split_zhou_OxfordPets.json").unlink()
    message = raises_one_line(DataError, pets, root)
    assert "split_zhou_OxfordPets.json: file not found; expected a JSON object" in message


def test_malformed_split_json(root):
    (root / "oxford_pets" / "split_zhou_OxfordPets.json").write_text('{"train": [["a.png", 0')
    message = raises_one_line(DataError, pets, root)
    assert "split_zhou_OxfordPets.json: not valid JSON (line 1" in message


@pytest.mark.parametrize("content,fragment", [
    ({"train": [["a.png", "zero", "cat"]], "val": [["a.png", 0, "cat"]],
      "test": [["a.png", 0, "cat"]]}, "train[0] is ['a.png', 'zero', 'cat']; expected [image path"),
    ({"train": [["a.png", 0, "cat"]], "test": [["a.png", 0, "cat"]]}, "no non-empty 'val' list"),
    ([1, 2], "top level is a list; expected"),
])
def test_split_json_with_wrong_structure(root, content, fragment):
    (root / "oxford_pets" / "split_zhou_OxfordPets.json").write_text(json.dumps(content))
    assert fragment in raises_one_line(DataError, pets, root)


def test_split_entry_pointing_at_missing_image(root):
    split = json.loads((root / "oxford_pets" / "split_zhou_OxfordPets.json").read_text())
    missing = root / "oxford_pets" / "images" / split["test"][3][0]
    missing.unlink()
    message = raises_one_line(DataError, pets, root)
    assert message.startswith(f"{missing}: image file not found (listed in ")
    assert "split_zhou_OxfordPets.json" in message


def test_wrong_class_count(root):
    path = root / "oxford_pets" / "split_zhou_OxfordPets.json"
    split = json.loads(path.read_text())
    split["train"] = [e for e in split["train"] if e[1] != 36]  # a partial download
    path.write_text(json.dumps(split))
    assert "found 36 classes in the train split; expected 37" in raises_one_line(DataError, pets,
                                                                                 root)


def test_unreadable_image(root):
    data = pets(root)["train"]
    Path(data.images[0]).write_bytes(b"not a png at all")
    with pytest.raises(DataError, match=f"{data.images[0]}: unreadable image"):
        LabelledImageDataset(data, lambda image: image)[0]
    with pytest.raises(DataError, match="image file not found"):
        load_image(root / "nothing.png")


def test_unknown_dataset_name(root):
    cfg = DataConfig(task="classification", dataset="oxford_petz", root=str(root))
    message = raises_one_line(ConfigError, build_classification, cfg, 1)
    assert "data.dataset: unknown classification dataset 'oxford_petz'" in message
    assert "oxford_pets" in message  # lists the known names
    cfg = DataConfig(dataset="flickr30k", root=str(root))
    assert "unknown retrieval dataset 'flickr30k'" in raises_one_line(ConfigError, build_retrieval,
                                                                      cfg, 1)
    with pytest.raises(ConfigError, match="data.root"):
        build_retrieval(DataConfig(dataset="coco"), 1)


def test_aircraft_bad_files(root):
    variants = root / "fgvc_aircraft" / "variants.txt"
    text = variants.read_text()
    variants.write_text("\n".join(text.splitlines()[1:]))  # first variant no longer listed
    message = raises_one_line(DataError, load_classification, root, "fgvc_aircraft", shots=1,
                              seed=1)
    assert "images_variant_train.txt: line 1 names variant" in message and "variants.txt" in message
    variants.unlink()
    assert "variants.txt: file not found; expected one aircraft variant name per line" in \
        raises_one_line(DataError, load_classification, root, "fgvc_aircraft", shots=1, seed=1)


def test_imagenet_variant_bad_layout(root):
    image_dir = root / "imagenet-adversarial" / "imagenet-a"
    shutil.rmtree(image_dir / sorted(p.name for p in image_dir.iterdir() if p.is_dir())[0])
    message = raises_one_line(DataError, load_classification, root, "imagenet_a", shots=1, seed=1)
    assert f"{image_dir}: found 199 class folders; expected 200" in message
    (root / "imagenet-adversarial" / "classnames.txt").write_text("n0000 \n")
    assert "has no class name" in raises_one_line(DataError, load_classification, root,
                                                  "imagenet_a", shots=1, seed=1)
    (root / "imagenet-adversarial" / "classnames.txt").unlink()
    assert "classnames.txt: file not found" in raises_one_line(
        DataError, load_classification, root, "imagenet_a", shots=1, seed=1)


def test_coco_bad_inputs(root):
    json_path = root / "coco" / "dataset_coco.json"
    data = json.loads(json_path.read_text())
    entry = data["images"][2]
    missing = root / "coco" / "images" / entry["filepath"] / entry["filename"]
    missing.unlink()
    assert raises_one_line(DataError, load_coco, root).startswith(
        f"{missing}: image file not found")
    data["images"][1]["sentences"] = data["images"][1]["sentences"][:3]
    json_path.write_text(json.dumps(data))
    assert "images[1] (cocoid" in raises_one_line(DataError, load_coco, root)
    del data["images"][0]["cocoid"]
    json_path.write_text(json.dumps(data))
    assert "images[0]: missing or malformed field (KeyError" in raises_one_line(DataError,
                                                                               load_coco, root)
    json_path.write_text("[]")
    assert "no non-empty 'images' list" in raises_one_line(DataError, load_coco, root)
    json_path.unlink()
    assert "dataset_coco.json: file not found" in raises_one_line(DataError, load_coco, root)
    shutil.rmtree(root / "coco")
    assert f"{root / 'coco'}: folder not found" in raises_one_line(DataError, load_coco, root)
