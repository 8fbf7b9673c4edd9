"""The torch Datasets that read a split's records (base.py) for training and evaluation.

Apart from base.py so that the records, the loaders and the synthetic generator import no torch
(a sweep's driver writes the synthetic data without it).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from vacsr.data.base import ClassificationData, ImageRef, RetrievalData, load_image


class ImageDataset(torch.utils.data.Dataset):
    """Images alone (evaluation and feature caching), transformed to tensors."""

    def __init__(self, images: Sequence[ImageRef], transform: Callable) -> None:
        self.images, self.transform = images, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        return self.transform(load_image(self.images[index])), index


class _SplitDataset(torch.utils.data.Dataset):
    """A split's records, one item per entry of its `items` field, each image transformed."""

    items = ""  # the records' field with one entry per item

    def __init__(self, data: RetrievalData | ClassificationData, transform: Callable) -> None:
        self.data, self.transform = data, transform

    def __len__(self) -> int:
        return len(getattr(self.data, self.items))

    def image(self, image_index: int):
        return self.transform(load_image(self.data.images[image_index]))


class CaptionPairDataset(_SplitDataset):
    """One item per caption: (image tensor, caption text, image index) for retrieval training."""

    items = "captions"

    def __getitem__(self, index: int):
        image_index = self.data.caption_to_image[index]
        return self.image(image_index), self.data.captions[index], image_index


class LabelledImageDataset(_SplitDataset):
    """(image tensor, label) for classification training and evaluation."""

    items = "labels"

    def __getitem__(self, index: int):
        return self.image(index), self.data.labels[index]
