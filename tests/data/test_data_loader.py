"""DataLoader construction: the Trainer's seeded global batches, worker seeding, pinning, one-line
errors from workers."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from vacsr.config import load_config
from vacsr.data.base import ClassificationData
from vacsr.data.datasets import LabelledImageDataset
from vacsr.data.loader import image_loader, make_loader, wants_pinning
from vacsr.errors import DataError
from vacsr.tasks import task_type
from vacsr.train.loop import Trainer


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


def bare_trainer(*overrides: str) -> Trainer:
    """A Trainer with only what `train_loader` reads (config, device): no model, no data."""
    trainer = Trainer.__new__(Trainer)
    trainer.config = load_config(overrides=["data.task=classification", *overrides])
    trainer.device = torch.device("cpu")
    trainer.task = task_type("classification")  # its collate: the loader's default stacking
    trainer.model = SimpleNamespace(backbone=None)  # the classification collate reads none
    return trainer


class IndexDataset(torch.utils.data.Dataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        return index


def trainer_batches(seed: int, epoch: int, size: int = 50, batch_size: int = 16) -> list[list[int]]:
    trainer = bare_trainer(f"train.seed={seed}", f"train.batch_size={batch_size}")
    return [batch.tolist() for batch in trainer.train_loader(epoch, dataset=IndexDataset(size))]


def test_trainer_loader_shuffles_seeded_and_drops_the_last_partial_batch():
    batches = trainer_batches(seed=1, epoch=0)
    # 50 items, batch 16: three full batches, the partial one (2 items) dropped
    assert [len(b) for b in batches] == [16, 16, 16]
    items = [i for b in batches for i in b]
    assert len(set(items)) == 48 and set(items) <= set(range(50))
    assert items != sorted(items)  # shuffled
    assert trainer_batches(seed=1, epoch=0) == batches  # same (seed, epoch), same batches
    assert trainer_batches(seed=2, epoch=0) != batches  # the run seed changes the order
    assert trainer_batches(seed=1, epoch=1) != batches  # and so does the epoch
    # an exact multiple of the batch size keeps every item
    assert sorted(i for b in trainer_batches(1, 0, size=48) for i in b) == list(range(48))


def test_worker_error_is_one_line(tmp_path):
    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    Image.new("RGB", (8, 8)).save(good)
    bad.write_bytes(b"\x89PNG broken")
    data = ClassificationData(images=[str(good), str(bad)], labels=[0, 1], classnames=["a", "b"])
    trainer = bare_trainer("train.batch_size=2", "data.num_workers=1")
    dataset = LabelledImageDataset(data, lambda image: torch.zeros(1))
    loader = trainer.train_loader(0, dataset=dataset)
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
