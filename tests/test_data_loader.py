"""DataLoader construction: seeded order, worker seeding, pinning, one-line errors from workers."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from vacsr.data.base import ClassificationData
from vacsr.data.loader import classification_loader, image_loader, make_loader, wants_pinning
from vacsr.errors import DataError


class RandomDataset(torch.utils.data.Dataset):
    """Returns numpy randomness so that worker seeding is visible."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index):
        return index, float(np.random.rand())


def order(seed: int) -> list[int]:
    loader = make_loader(torch.utils.data.TensorDataset(torch.arange(32)), batch_size=8,
                         shuffle=True, seed=seed)
    return [int(x) for (batch,) in loader for x in batch]


def test_shuffle_is_seeded():
    assert order(1) == order(1)
    assert order(1) != order(2) and sorted(order(1)) == list(range(32))


def test_workers_get_distinct_numpy_seeds():
    loader = make_loader(RandomDataset(), batch_size=1, num_workers=2, seed=0)
    values = [float(v) for _, v in loader]
    assert len(set(values)) == len(values)  # without seed_worker, both workers repeat values
    assert loader.persistent_workers and loader.prefetch_factor == 4


def test_pinning_follows_the_target_device():
    assert not wants_pinning("cpu") and wants_pinning("cuda:0")
    assert not image_loader([], lambda x: x, batch_size=2, device="cpu").pin_memory


def test_worker_error_is_one_line(tmp_path):
    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    Image.new("RGB", (8, 8)).save(good)
    bad.write_bytes(b"\x89PNG broken")
    data = ClassificationData(images=[str(good), str(bad)], labels=[0, 1], classnames=["a", "b"])
    loader = classification_loader(data, lambda image: torch.zeros(1), batch_size=1, train=False,
                                   num_workers=1)
    with pytest.raises(DataError) as info:
        list(loader)
    assert str(info.value) == f"{bad}: unreadable image (UnidentifiedImageError)"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_are_pinned_for_cuda():
    loader = make_loader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=4,
                         device="cuda")
    (batch,) = next(iter(loader))
    assert batch.is_pinned()
