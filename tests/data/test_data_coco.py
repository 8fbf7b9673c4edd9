"""COCO Karpathy loading, 1K folds and noisy correspondence (paper appendix C.1)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vacsr.config import DataConfig
from vacsr.data import build_retrieval
from vacsr.data.coco import load_coco
from vacsr.data.generate import write_coco
from vacsr.data.noise import load_noise, make_noisy_index, noisy_caption_to_image
from vacsr.errors import DataError
from vacsr.eval.metrics import fold_groups
from vacsr.tasks import RetrievalTask


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("coco_root")
    write_coco(root, seed=0)
    return root


@pytest.fixture(scope="module")
def karpathy(root) -> list[dict]:
    return json.loads((root / "coco" / "dataset_coco.json").read_text())["images"]


def test_splits_counts_and_karpathy_order(root, karpathy):
    splits = load_coco(root)
    by_split = {s: [e for e in karpathy if e["split"] == s] for s in ("train", "restval", "val",
                                                                     "test")}
    train, test = splits["train"], splits["test"]
    assert len(train.images) == len(by_split["train"]) + len(by_split["restval"])  # 40 + 10
    assert len(train.captions) == 5 * len(train.images)
    assert len(test.images) == 25 and len(test.captions) == 125 and len(splits["val"].images) == 10
    assert test.image_ids == [e["cocoid"] for e in by_split["test"]]
    # caption ids: the first five sentids of each image, 5 consecutive per image (eccv order)
    assert test.caption_ids == [s["sentid"] for e in by_split["test"] for s in e["sentences"][:5]]
    assert test.caption_to_image == [i // 5 for i in range(125)]
    assert test.captions[0] == by_split["test"][0]["sentences"][0]["raw"].strip()
    assert test.images[0].endswith(f"images/val2014/{by_split['test'][0]['filename']}")


def test_six_caption_images_keep_the_first_five(root, karpathy):
    six = next(e for e in karpathy if len(e["sentences"]) == 6 and e["split"] == "test")
    test = load_coco(root)["test"]
    index = test.image_ids.index(six["cocoid"])
    assert test.caption_ids[5 * index: 5 * index + 5] == six["sentids"][:5]


def test_images_found_without_images_folder(root, tmp_path):
    (tmp_path / "coco").mkdir()
    for name in ("dataset_coco.json",):
        (tmp_path / "coco" / name).write_bytes((root / "coco" / name).read_bytes())
    for sub in ("train2014", "val2014"):
        (tmp_path / "coco" / sub).symlink_to(root / "coco" / "images" / sub)
    assert len(load_coco(tmp_path)["test"].images) == 25


def test_1k_folds(root):
    """The folds the evaluation uses (fold_groups): 5 consecutive image blocks of the test split,
    each caption in its image's fold (COCO 5K: images 1000-1999 with captions 5000-9999, ...)."""
    assert RetrievalTask.num_folds("test", 5000) == 5
    images, captions = fold_groups(np.repeat(np.arange(5000), 5), 5000, 5)
    assert np.flatnonzero(images.numpy() == 1).tolist() == list(range(1000, 2000))
    assert np.flatnonzero(captions.numpy() == 1).tolist() == list(range(5000, 10000))
    test = load_coco(root)["test"]  # 25 images, 125 captions
    assert RetrievalTask.num_folds("test", len(test.images)) == 5
    images, captions = fold_groups(test.caption_to_image, len(test.images), 5)
    assert np.flatnonzero(images.numpy() == 4).tolist() == list(range(20, 25))
    assert np.flatnonzero(captions.numpy() == 4).tolist() == list(range(100, 125))
    # a test split that does not split into 5 equal folds gets no COCO 1K metrics
    assert RetrievalTask.num_folds("test", 24) is None
    assert RetrievalTask.num_folds("val", 5000) is None
    with pytest.raises(ValueError):
        fold_groups(list(range(24)), 24, 5)


@pytest.mark.parametrize("ratio", [0.2, 0.5])
def test_noise_ratio_exact_and_reproducible(ratio):
    clean = np.repeat(np.arange(2000), 5)
    noisy, selected = make_noisy_index(clean, ratio, seed=1)
    assert len(selected) == int(ratio * len(clean)) and len(set(selected.tolist())) == len(selected)
    changed = np.flatnonzero(noisy != clean)
    assert set(changed.tolist()) <= set(selected.tolist())  # only the selected captions move
    assert len(changed) >= 0.99 * len(selected)  # with 2,000 images, few land on their own image
    assert np.array_equal(np.bincount(noisy), np.bincount(clean))  # permuted among themselves
    again, _ = make_noisy_index(clean, ratio, seed=1)
    other, _ = make_noisy_index(clean, ratio, seed=2)
    assert np.array_equal(noisy, again) and not np.array_equal(noisy, other)


def test_noise_matches_ncr_reference():
    clean = np.arange(500) // 5
    np.random.seed(7)  # NCR: global seed, shuffle indices, shuffle the selected image indices
    reference = clean.copy()
    idx = np.arange(len(clean))
    np.random.shuffle(idx)
    shuffle_index = reference[idx[:int(0.2 * len(clean))]]
    np.random.shuffle(shuffle_index)
    reference[idx[:int(0.2 * len(clean))]] = shuffle_index
    assert np.array_equal(make_noisy_index(clean, 0.2, seed=7)[0], reference)


def test_noise_index_saved_and_reused(tmp_path):
    clean = np.repeat(np.arange(100), 5)
    path = tmp_path / "noise.npy"
    first = noisy_caption_to_image(clean, 0.5, seed=1, path=path)
    assert path.is_file()
    # reused even when asked with another seed: the saved file is the experiment's noise
    assert np.array_equal(noisy_caption_to_image(clean, 0.5, seed=9, path=path), first)
    with pytest.raises(DataError, match="noise.npy.*expected a 1-D integer array of 495"):
        load_noise(path, clean[:495])


def test_coco_train_is_noisy_with_saved_index(root, tmp_path):
    clean = load_coco(root)["train"]
    noisy = load_coco(root, noise_ratio=0.2, seed=1, cache_dir=tmp_path)["train"]
    saved = list(tmp_path.glob("noise_index/*.npy"))
    assert len(saved) == 1 and np.load(saved[0]).tolist() == noisy.caption_to_image
    differs = sum(a != b for a, b in zip(clean.caption_to_image, noisy.caption_to_image))
    assert 0 < differs <= int(0.2 * len(clean.captions))
    assert noisy.captions == clean.captions and noisy.caption_ids == clean.caption_ids
    test = load_coco(root, noise_ratio=0.2, seed=1, cache_dir=tmp_path)["test"]
    assert test.caption_to_image == [i // 5 for i in range(125)]  # evaluation stays clean


def test_build_retrieval_dispatches(root, tmp_path):
    cfg = DataConfig(dataset="coco", root=str(root), noise_ratio=0.5,
                     noise_file=str(tmp_path / "n.npy"))
    splits = build_retrieval(cfg, seed=1)
    assert {"train", "test"} <= set(splits) and (tmp_path / "n.npy").is_file()
    assert len(build_retrieval(DataConfig(num_train=4, num_test=3), seed=0)["test"].images) == 3
    clean = build_retrieval(DataConfig(num_train=40), seed=0)["train"].caption_to_image
    noisy = build_retrieval(DataConfig(num_train=40, noise_ratio=0.5), seed=0)["train"]
    assert 0 < sum(a != b for a, b in zip(clean, noisy.caption_to_image)) <= 100


def test_ids_match_eccv_caption_ground_truth(tmp_path):
    """Our (image id, caption id) semantics are those of the eccv_caption package's GT."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eccv_caption warns when ujson is missing
        from eccv_caption import Metrics
    metrics = Metrics()
    caption_ids = [int(c) for c in metrics.coco_ids[:50]]
    t2i = metrics.coco_gts["t2i"]
    images, folder = [], tmp_path / "coco" / "images" / "val2014"
    folder.mkdir(parents=True)
    for index in range(0, 50, 5):
        cocoid = t2i[caption_ids[index]][0]
        filename = f"COCO_val2014_{cocoid:012d}.jpg"
        Image.new("RGB", (4, 4)).save(folder / filename)
        images.append({"filepath": "val2014", "filename": filename, "cocoid": cocoid,
                       "split": "test", "sentences": [{"raw": f"caption {c}", "sentid": c}
                                                      for c in caption_ids[index:index + 5]]})
    (tmp_path / "coco" / "dataset_coco.json").write_text(json.dumps({"images": images}))
    test = load_coco(tmp_path)["test"]
    assert test.caption_ids == caption_ids
    for index, image_id in enumerate(test.image_ids):
        mine = {c for c, i in zip(test.caption_ids, test.caption_to_image) if i == index}
        assert mine == set(metrics.coco_gts["i2t"][image_id])
