"""The generator writes real layouts whose images carry learnable class / caption content."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
from PIL import Image

from vacsr.data.classification import load_classification
from vacsr.data.coco import load_coco
from vacsr.data.generate import class_image, class_words, generate_all
from vacsr.data.synthetic import COLORS


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return generate_all(tmp_path_factory.mktemp("gen"), seed=0, datasets=["dtd", "coco"])


def pixels(path: str) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB").resize((16, 16)), dtype=np.float32).ravel() / 255


def test_classes_are_learnable_from_pixels(root):
    """Nearest class centroid on raw pixels, fit on the few-shot train split, scores far above
    chance on the test split: the class is in the pixels, not only in the file name."""
    splits = load_classification(root, "dtd", shots=4, seed=1, subsample="all")
    train, test = splits["train"], splits["test"]
    x = np.stack([pixels(p) for p in train.images])
    labels = np.array(train.labels)
    centroids = np.stack([x[labels == c].mean(0) for c in range(47)])
    test_x = np.stack([pixels(p) for p in test.images])
    predicted = ((test_x[:, None] - centroids[None]) ** 2).sum(-1).argmin(1)
    accuracy = float((predicted == np.array(test.labels)).mean())
    assert accuracy > 10 / 47, accuracy  # chance is 1/47


def test_class_codes_are_distinct_up_to_imagenet():
    names = {" ".join(class_words(label)) for label in range(1000)}
    assert len(names) == 1000
    one, other = class_image(70, 32, random.Random(0)), class_image(6, 32, random.Random(0))
    assert one.tobytes() != other.tobytes()  # same scene (70 % 64 == 6), the band differs


def test_coco_captions_describe_the_image(root):
    """The caption's colour word names the colour of the image's shape."""
    data = json.loads((root / "coco" / "dataset_coco.json").read_text())
    train = load_coco(root)["train"]
    checked = 0
    for image_index in range(10):
        colour = next(w for w in train.captions[5 * image_index].split() if w in COLORS)
        target = np.array(COLORS[colour], dtype=np.float32)
        rgb = np.asarray(Image.open(train.images[image_index]).convert("RGB"), dtype=np.float32)
        distance = np.abs(rgb - target).sum(-1)
        checked += int((distance < 60).sum() > 10)  # JPEG keeps the colour within a few levels
    assert checked == 10 and len(data["images"]) == 85


def test_an_empty_list_of_datasets_writes_none(tmp_path):
    """A retrieval sweep on its in-memory `synthetic` data needs no layout: none is written
    (a missing list writes them all)."""
    assert list(generate_all(tmp_path / "none", datasets=[]).iterdir()) == []
