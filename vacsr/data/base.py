"""In-memory descriptions of a dataset split (the torch Datasets that read them: datasets.py).

Loaders of the real on-disk layouts and the synthetic generator both produce these records, so the
training code sees one interface. An image is a path (read lazily) or an already-built PIL image.

Decoded images are bounded by MAX_IMAGE_PIXELS, checked on the size the file's header declares
before any pixel is decoded: a small file can declare a huge canvas (a decompression bomb) and
take a DataLoader worker's memory.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from PIL import Image

from vacsr.errors import DataError

ImageRef = Union[str, Path, Image.Image]
# PIL's own default limit (2**30 / 4 / 3 pixels: 89.5 Mpx, 0.25 GiB decoded as RGB), far above any
# image of the paper's datasets, which CLIP's preprocessing resizes to 224 px anyway
MAX_IMAGE_PIXELS = 89_478_485
# PIL warns about an image over its limit (the same) as it opens it, before load_image refuses it:
# the warning would be a second line beside the error
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


@dataclass
class RetrievalData:
    """Images and captions; caption j describes image caption_to_image[j].

    image_groups (optional, one integer per image): images of equal group show the same content, so
    a caption of one is a correct match for all of them (extended ground truth, as ECCV Caption adds
    to COCO; paper appendix C.1). A caption's group is its image's group. None = binary ground
    truth only (real COCO); the synthetic data fills it with the scene index.
    """

    images: list[ImageRef]
    captions: list[str]
    caption_to_image: list[int]
    image_ids: list[int] = field(default_factory=list)  # e.g. COCO image ids (for ECCV/CxC)
    caption_ids: list[int] = field(default_factory=list)  # e.g. COCO caption annotation ids
    image_groups: list[int] | None = None  # semantic group per image (extended ground truth)

    def __post_init__(self) -> None:
        if len(self.captions) != len(self.caption_to_image):
            raise DataError(f"{len(self.captions)} captions but {len(self.caption_to_image)} "
                            "caption-to-image indices")
        if self.image_groups is not None and len(self.image_groups) != len(self.images):
            raise DataError(f"{len(self.images)} images but {len(self.image_groups)} image groups")


@dataclass
class ClassificationData:
    """Labelled images; labels are 0..C-1 indices into classnames."""

    images: list[ImageRef]
    labels: list[int]
    classnames: list[str]
    template: str = "a photo of a {}."

    def prompts(self) -> list[str]:
        return [self.template.format(name.replace("_", " ")) for name in self.classnames]


def load_image(ref: ImageRef) -> Image.Image:
    """Open an image as RGB, or raise DataError naming the file."""
    if isinstance(ref, Image.Image):
        return ref.convert("RGB")
    try:
        with Image.open(ref) as img:
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise DataError(_too_large(ref, width * height, f"{width}x{height}, "))
            return img.convert("RGB")
    except FileNotFoundError:
        raise DataError(f"{ref}: image file not found") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # PIL refuses an image over twice its limit as it opens it, naming the pixel count only
        pixels = re.search(r"\((\d+) pixels\)", str(exc))
        raise DataError(_too_large(ref, int(pixels[1]) if pixels else None)) from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{ref}: unreadable image ({exc.__class__.__name__})") from None


def _too_large(ref: ImageRef, pixels: int | None, size: str = "") -> str:
    count = f"{pixels / 1e6:.1f} Mpx" if pixels else "over twice PIL's limit"
    return (f"{ref}: image of {size}{count} is too large to decode; expected at most "
            f"{MAX_IMAGE_PIXELS / 1e6:.1f} Mpx (vacsr.data.base.MAX_IMAGE_PIXELS; a larger "
            "one may be a decompression bomb)")
