"""Feature cache: reused while its key holds, rebuilt when model, weights, preprocessing or data
change."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from vacsr.data.classification import load_classification
from vacsr.data.encoding import encode_images
from vacsr.data.feature_cache import (FeatureCache, backbone_identity, cache_classification,
                                      describe_transform, image_features, weights_identity)
from vacsr.data.generate import class_image, write_split_dataset
from vacsr.model.backbone import ClipBackbone


@pytest.fixture(scope="module")
def backbone() -> ClipBackbone:
    torch.manual_seed(0)
    return ClipBackbone(name="vacsr-tiny", use_gpo=False).eval()


@pytest.fixture(scope="module")
def eurosat(tmp_path_factory):
    root = tmp_path_factory.mktemp("eurosat_root")
    write_split_dataset(root, "eurosat")
    return load_classification(root, "eurosat", shots=2, seed=1, subsample="all")["test"]


def identity(backbone) -> dict[str, str]:
    return backbone_identity(backbone, name="vacsr-tiny", pretrained=None)


class CountingEncode:
    def __init__(self, backbone):
        self.backbone, self.calls = backbone, 0

    def __call__(self, images):
        self.calls += 1
        return encode_images(self.backbone, images, batch_size=8).numpy()


def test_reused_when_key_unchanged(backbone, eurosat, tmp_path):
    cache = FeatureCache(tmp_path, identity(backbone))
    images, prompts = cache_classification(cache, backbone, eurosat, "eurosat-test", batch_size=8)
    assert images.built and prompts.built
    assert images.features.shape == (len(eurosat.images), backbone.embed_dim)
    assert images.labels.tolist() == eurosat.labels and prompts.features.shape[0] == 10
    again_images, again_prompts = cache_classification(FeatureCache(tmp_path, identity(backbone)),
                                                       backbone, eurosat, "eurosat-test")
    assert not again_images.built and not again_prompts.built
    assert np.array_equal(again_images.features, images.features)
    assert again_images.ids.tolist() == list(range(len(eurosat.images)))
    # what is cached is what the backbone computes
    direct = encode_images(backbone, eurosat.images[:4], batch_size=4).numpy()
    np.testing.assert_allclose(again_images.features[:4], direct, atol=1e-5)
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temporaries


@pytest.mark.parametrize("field,value", [("model", "ViT-B-32"),
                                         ("weights", "tag:laion2b_s34b_b79k"),
                                         ("preprocess", "Resize(224); CenterCrop(224)")])
def test_changed_key_rebuilds(backbone, eurosat, tmp_path, field, value):
    counter = CountingEncode(backbone)
    base = identity(backbone)
    images, ids = eurosat.images[:6], list(range(6))
    for ident in (base, base):
        FeatureCache(tmp_path, ident).get_or_build("x", "content", lambda: counter(images), ids)
    assert counter.calls == 1
    changed = dict(base, **{field: value})
    entry = FeatureCache(tmp_path, changed).get_or_build("x", "content",
                                                          lambda: counter(images), ids)
    assert counter.calls == 2 and entry.built and len(list(tmp_path.glob("x-*.parquet"))) == 2


def test_changed_weights_or_data_rebuild(backbone, eurosat, tmp_path):
    images, ids = [str(tmp_path / f"{i}.png") for i in range(4)], [0, 1, 2, 3]
    for source, target in zip(eurosat.images, images):
        shutil.copy(source, target)
    first = image_features(FeatureCache(tmp_path, identity(backbone)), backbone, images, ids,
                           name="w")
    torch.manual_seed(123)  # another random init than the fixture's seed 0
    modified = ClipBackbone(name="vacsr-tiny", use_gpo=False).eval()
    assert identity(modified)["weights"] != identity(backbone)["weights"]
    second = image_features(FeatureCache(tmp_path, identity(modified)), backbone, images, ids,
                            name="w")
    assert second.built and second.path != first.path
    # regenerating an image in place (same path, new pixels) must not serve stale features
    class_image(7, 48, random.Random(1)).save(images[0])
    third = image_features(FeatureCache(tmp_path, identity(backbone)), backbone, images, ids,
                           name="w")
    assert third.built and not np.allclose(third.features[0], first.features[0])


def test_damaged_file_is_rebuilt(backbone, eurosat, tmp_path):
    cache = FeatureCache(tmp_path, identity(backbone))
    entry = image_features(cache, backbone, eurosat.images[:3], [5, 6, 7], name="d")
    entry.path.write_bytes(b"truncated")
    rebuilt = image_features(cache, backbone, eurosat.images[:3], [5, 6, 7], name="d")
    assert rebuilt.built and pq.read_table(rebuilt.path).column("id").to_pylist() == [5, 6, 7]


def test_identity_fields(backbone, tmp_path):
    assert "0x" not in describe_transform(backbone.eval_transform)
    assert describe_transform(lambda x: x).endswith("<lambda>")
    assert "Normalize" in identity(backbone)["preprocess"]
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"1234")
    assert weights_identity(str(weights), backbone).endswith(":4:" + str(
        weights.stat().st_mtime_ns))
    assert weights_identity("openai", backbone) == "tag:openai"
    gpo = ClipBackbone(name="vacsr-tiny", use_gpo=True)
    assert backbone_identity(gpo, name="vacsr-tiny", pretrained="openai")["features"].startswith(
        "gpo:")


def test_parquet_layout(backbone, eurosat, tmp_path):
    entry = image_features(FeatureCache(tmp_path, identity(backbone)), backbone,
                           eurosat.images[:2], [11, 12], name="layout", labels=[0, 1])
    table = pq.read_table(Path(entry.path))
    assert table.column_names == ["id", "feature", "label"]
    assert table.schema.field("feature").type.list_size == backbone.embed_dim
    assert b"vacsr.identity" in table.schema.metadata
