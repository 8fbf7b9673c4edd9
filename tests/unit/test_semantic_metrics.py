"""Extended ground truth of the synthetic data (same scene = relevant) and the sem_* metrics:
ECCV Caption's mAP@R, R-Precision and R@1 with positives = every item of the query's group."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vacsr.config import DataConfig
from vacsr.data import build_retrieval
from vacsr.data.coco import load_coco
from vacsr.data.generate import write_coco
from vacsr.data.synthetic import COLORS, SHAPES, SIDES, Scene, all_scenes, synthetic_retrieval
from vacsr.errors import DataError
from vacsr.eval.evaluate import evaluate_retrieval
from vacsr.eval.semantic import semantic_depth
from vacsr.model.adapter import SigmoidBaselineHead
from vacsr.train.eval_pass import evaluate_split

SEM_KEYS = {f"sem_{m}{d}" for m in ("map_at_r", "rprecision", "r1") for d in ("_i2t", "_t2i", "")}


def _scene_of(caption: str) -> int:
    """The scene index a caption names (its colour, shape and side words)."""
    words = caption.split()
    pick = lambda vocab: next(w for w in words if w in vocab)  # noqa: E731
    return all_scenes().index(Scene(pick(COLORS), pick(SHAPES), pick(SIDES)))


def _assert_groups_are_scenes(data) -> None:
    assert data.image_groups is not None and len(data.image_groups) == len(data.images)
    for caption, image in zip(data.captions, data.caption_to_image):
        assert _scene_of(caption) == data.image_groups[image]


# ---------------------------------------------------------------- data carries the groups
def test_synthetic_retrieval_groups_are_scene_indices():
    data = synthetic_retrieval(100, seed=3)
    _assert_groups_are_scenes(data)
    assert len(set(data.image_groups)) < len(data.images)  # some scene shown by several images


def test_noise_permutes_train_captions_only_and_keeps_groups():
    clean = build_retrieval(DataConfig(num_train=40, num_test=20), seed=0)
    noisy = build_retrieval(DataConfig(num_train=40, num_test=20, noise_ratio=0.5), seed=0)
    assert noisy["train"].caption_to_image != clean["train"].caption_to_image
    assert noisy["train"].image_groups == clean["train"].image_groups
    for split in ("val", "test"):
        assert noisy[split].caption_to_image == clean[split].caption_to_image
        _assert_groups_are_scenes(noisy[split])


@pytest.fixture(scope="module")
def coco_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("coco_sem")
    write_coco(root, seed=0, num_train=6, num_restval=2, num_val=3, num_test=10, size=16)
    return root


def _copy_coco(src: Path, dst: Path, edit) -> Path:
    """dst/coco with src's images and an edited dataset_coco.json."""
    (dst / "coco").mkdir(parents=True)
    (dst / "coco" / "images").symlink_to(src / "coco" / "images")
    data = json.loads((src / "coco" / "dataset_coco.json").read_text())
    edit(data["images"])
    (dst / "coco" / "dataset_coco.json").write_text(json.dumps(data))
    return dst


def test_write_coco_load_coco_round_trip_keeps_groups(coco_root):
    entries = json.loads((coco_root / "coco" / "dataset_coco.json").read_text())["images"]
    splits = load_coco(coco_root)
    members = {"train": ("train", "restval"), "val": ("val",), "test": ("test",)}
    for name, data in splits.items():
        assert data.image_groups == [e["scene"] for e in entries if e["split"] in members[name]]
        _assert_groups_are_scenes(data)


def test_karpathy_json_without_the_field_gives_none(coco_root, tmp_path):
    def strip(entries):
        for entry in entries:
            del entry["scene"]

    splits = load_coco(_copy_coco(coco_root, tmp_path, strip))
    assert all(data.image_groups is None for data in splits.values())
    assert len(splits["test"].images) == 10


def test_partial_group_field_is_a_data_error(coco_root, tmp_path):
    with pytest.raises(DataError, match="2 of 21 images have a 'scene' field"):
        load_coco(_copy_coco(coco_root, tmp_path, lambda entries: [e.pop("scene")
                                                                   for e in entries[2:]]))


# ---------------------------------------------------------------- the metrics, by hand
# 4 images, one caption each (caption j describes image j); groups: {0, 2} and {1, 3}, so every
# query has R = 2 positives: its own item and the other image of its group (or that one's caption).
HAND_GROUPS = [0, 1, 0, 1]
HAND_SCORES = torch.tensor([  # (images, captions); row i ranks the captions of image query i
    # i0: c1 c0 | c2 c3  rel 0 1 -> AP@R (0 + 1/2)/2 = 0.25, R-P 1/2, R@1 0
    [0.80, 0.90, 0.50, 0.10],
    [0.20, 0.95, 0.30, 0.70],  # i1: c1 c3 | c2 c0  rel 1 1 -> 1, 1, 1
    [0.85, 0.00, 0.40, 0.60],  # i2: c0 c3 | c2 c1  rel 1 0 -> 0.5, 1/2, 1 (own caption only 3rd)
    [0.75, 0.35, 0.65, 0.05],  # i3: c0 c2 | c1 c3  rel 0 0 -> 0, 0, 0
])
# Columns (caption queries): c0: i2 i0 -> 1, 1, 1; c1: i1 i0 -> 0.5, 1/2, 1;
# c2: i3 i0 -> 0.25, 1/2, 0; c3: i1 i2 -> 0.5, 1/2, 1.
HAND_EXPECTED = {
    "sem_map_at_r_i2t": 43.75, "sem_rprecision_i2t": 50.0, "sem_r1_i2t": 50.0,
    "sem_map_at_r_t2i": 56.25, "sem_rprecision_t2i": 62.5, "sem_r1_t2i": 75.0,
    "sem_map_at_r": 50.0, "sem_rprecision": 56.25, "sem_r1": 62.5,
}


def test_hand_example_matches_exactly():
    # one-hot image features and caption features = score columns: v_i . t_j = HAND_SCORES[i, j],
    # and the sigmoid head's logits 10 * cos - 10 keep that order
    images, captions = torch.eye(4), HAND_SCORES.T.contiguous()
    metrics = evaluate_retrieval(images, captions, SigmoidBaselineHead(), [0, 1, 2, 3],
                                 image_groups=HAND_GROUPS, device="cpu")
    assert {k: metrics[k] for k in HAND_EXPECTED} == HAND_EXPECTED
    assert metrics["i2t_r1"] == 25.0  # binary COCO ground truth: only i1 ranks its caption first
    plain = evaluate_retrieval(images, captions, SigmoidBaselineHead(), [0, 1, 2, 3], device="cpu")
    assert not SEM_KEYS & set(plain)


def _reference(scores: np.ndarray, relevant: np.ndarray) -> tuple[float, float, float]:
    """Brute force from a dense matrix: mean AP@R, R-P, R@1 (percent) over rows with R > 0."""
    maps, rps, r1s = [], [], []
    for row, rel in zip(scores, relevant):
        r = int(rel.sum())
        if r == 0:
            continue
        ranked = rel[np.argsort(-row, kind="stable")]
        hits = np.cumsum(ranked[:r])
        maps.append(sum(hits[i] / (i + 1) for i in range(r) if ranked[i]) / r)
        rps.append(hits[-1] / r)
        r1s.append(float(ranked[0]))
    return 100 * np.mean(maps), 100 * np.mean(rps), 100 * np.mean(r1s)


def test_deep_groups_match_brute_force_beyond_max_k():
    gen = torch.Generator().manual_seed(0)
    images = F.normalize(torch.randn(30, 16, generator=gen), dim=-1)
    captions = F.normalize(torch.randn(60, 16, generator=gen), dim=-1)
    caption_to_image = [j // 2 for j in range(60)]
    groups = [7 * (i % 3) - 5 for i in range(30)]  # 3 groups of 10 images, arbitrary ids
    depth = semantic_depth(groups, caption_to_image)
    assert depth == {"i2t": 20, "t2i": 10} and depth["i2t"] > 10  # deeper than R@10 needs
    metrics = evaluate_retrieval(images, captions, SigmoidBaselineHead(), caption_to_image,
                                 image_groups=groups, device="cpu", memory_budget_bytes=2**16)
    scores = (images @ captions.T).numpy()  # (30, 60), cosine order = head order
    image_group = np.asarray(groups)
    caption_group = image_group[caption_to_image]
    same = image_group[:, None] == caption_group[None, :]  # (30, 60)
    for direction, (s, rel) in {"i2t": (scores, same), "t2i": (scores.T, same.T)}.items():
        expected = _reference(s, rel)
        got = tuple(metrics[f"sem_{m}_{direction}"] for m in ("map_at_r", "rprecision", "r1"))
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------- the training-time path
class _ColourBackbone(nn.Module):
    """Stand-in CLIP: an image's feature is its centred mean RGB, a caption's its colour word's."""

    def __init__(self):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the encoders a device

    @staticmethod
    def eval_transform(image) -> torch.Tensor:
        return torch.as_tensor(np.array(image), dtype=torch.float32).mean(dim=(0, 1)) / 255  # (3,)

    def encode_image(self, batch: torch.Tensor) -> torch.Tensor:
        return F.normalize(batch - 0.5, dim=-1)  # (b, 3)

    def tokenize(self, texts) -> torch.Tensor:
        names = list(COLORS)
        return torch.tensor([[names.index(next(w for w in t.split() if w in COLORS))]
                             for t in texts])

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        rgb = torch.tensor(list(COLORS.values()), dtype=torch.float32)[tokens[:, 0]] / 255  # (b, 3)
        return F.normalize(rgb - 0.5, dim=-1)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone, self.head = _ColourBackbone(), SigmoidBaselineHead()


def test_evaluate_split_reports_semantic_metrics_on_grouped_data():
    data = synthetic_retrieval(24, seed=1)
    metrics = evaluate_split(_Model(), data, task="retrieval", device="cpu")
    assert SEM_KEYS <= set(metrics) and {"i2t_r1", "rsum"} <= set(metrics)
    assert all(0.0 <= metrics[k] <= 100.0 for k in SEM_KEYS)
    data.image_groups = None
    assert not SEM_KEYS & set(evaluate_split(_Model(), data, task="retrieval", device="cpu"))
