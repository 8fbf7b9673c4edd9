"""COCO retrieval with Karpathy's split (`dataset_coco.json`), as PCME++, VSE-inf and NCR use it.

Layout under data.root:
    coco/dataset_coco.json
    coco/images/<filepath>/<filename>   (e.g. images/val2014/COCO_val2014_000000391895.jpg)
or, without an images/ folder, coco/<filepath>/<filename>.

Karpathy's splits (paper appendix C.1): train = train + restval (113,287 images), val and test
5,000 images each, 5 captions per image (the first five sentences; a few COCO images have six or
seven).
Image ids are COCO image ids (`cocoid`) and caption ids are the caption annotation ids (`sentid`),
in Karpathy order, 5 consecutive per image: the order and keys of `eccv_caption.Metrics().coco_ids`,
so ECCV Caption and CxC ground truth can be matched by id.

An optional integer field `"scene"` per image entry (not in the real file; the synthetic COCO of
vacsr.data.generate writes it) is the image's semantic group: images of one scene share all their
captions' meaning, so RetrievalData.image_groups carries it as extended ground truth.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vacsr.data.base import RetrievalData
from vacsr.data.checked_io import check_files_exist, dataset_path, read_json, require_dir
from vacsr.data.noise import default_noise_path, noisy_caption_to_image
from vacsr.errors import DataError

CAPTIONS_PER_IMAGE = 5
KARPATHY_FILE = "dataset_coco.json"
GROUP_FIELD = "scene"  # optional per-image semantic group (synthetic COCO only)
SPLITS = {"train": ("train", "restval"), "val": ("val",), "test": ("test",)}
KARPATHY_EXPECTED = ("Karpathy's split: {'images': [{'filepath', 'filename', 'cocoid', 'split', "
                     "'sentences': [{'raw', 'sentid'}, ...]}, ...]}")


@dataclass(frozen=True)
class KarpathyImage:
    path: str  # <filepath>/<filename>, relative to the image root
    cocoid: int
    split: str
    captions: tuple[str, ...]
    sentids: tuple[int, ...]
    group: int | None = None  # the entry's GROUP_FIELD, None when absent (real COCO)


def _parse_image(entry, path: Path, index: int) -> KarpathyImage:
    where = f"{path}: images[{index}]"
    try:
        sentences = entry["sentences"][:CAPTIONS_PER_IMAGE]
        image = KarpathyImage(path=f"{entry['filepath']}/{entry['filename']}",
                              cocoid=int(entry["cocoid"]), split=str(entry["split"]),
                              captions=tuple(str(s["raw"]).strip() for s in sentences),
                              sentids=tuple(int(s["sentid"]) for s in sentences),
                              group=None if entry.get(GROUP_FIELD) is None
                              else int(entry[GROUP_FIELD]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(f"{where}: missing or malformed field ({exc.__class__.__name__}: {exc}); "
                        f"expected {KARPATHY_EXPECTED}") from None
    dataset_path(image.path, path, f"images[{index}]")
    if len(image.captions) < CAPTIONS_PER_IMAGE:
        raise DataError(f"{where} (cocoid {image.cocoid}) has {len(image.captions)} captions; "
                        f"expected at least {CAPTIONS_PER_IMAGE}")
    return image


def read_karpathy(path: Path) -> list[KarpathyImage]:
    """All images of dataset_coco.json in file order (the order Karpathy test ids follow)."""
    data = read_json(path, KARPATHY_EXPECTED)
    entries = data.get("images") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise DataError(f"{path}: no non-empty 'images' list; expected {KARPATHY_EXPECTED}")
    images = [_parse_image(entry, path, index) for index, entry in enumerate(entries)]
    grouped = sum(image.group is not None for image in images)
    if 0 < grouped < len(images):
        raise DataError(f"{path}: {grouped} of {len(images)} images have a {GROUP_FIELD!r} field; "
                        "expected it on every image or on none")
    return images


def image_root(dataset_dir: Path) -> Path:
    images = dataset_dir / "images"
    return images if images.is_dir() else dataset_dir


def to_retrieval(images: list[KarpathyImage], root: Path) -> RetrievalData:
    """Five consecutive captions per image, with COCO image and caption ids (and semantic groups
    when the file has them)."""
    captions, caption_to_image, caption_ids = [], [], []
    for index, image in enumerate(images):
        captions.extend(image.captions)
        caption_to_image.extend([index] * len(image.captions))
        caption_ids.extend(image.sentids)
    groups = [image.group for image in images]
    return RetrievalData(images=[str(root / image.path) for image in images], captions=captions,
                         caption_to_image=caption_to_image,
                         image_ids=[image.cocoid for image in images], caption_ids=caption_ids,
                         image_groups=None if None in groups else groups)


def check_coco_files(root: str | Path) -> tuple[Path, list[KarpathyImage]]:
    """(the coco folder, its Karpathy images) once every image of every split is known to be
    on disk: what each load reads, and what a sweep checks before its first trial."""
    root = Path(root).expanduser().absolute()  # trials may change the working directory (Ray)
    dataset_dir = require_dir(root / "coco", f"the COCO layout coco/{KARPATHY_FILE} "
                              "+ coco/images/<filepath>/<filename>")
    json_path = dataset_dir / KARPATHY_FILE
    images = read_karpathy(json_path)
    known = {name for members in SPLITS.values() for name in members}
    unknown = sorted({image.split for image in images} - known)
    if unknown:
        raise DataError(f"{json_path}: unknown split names {unknown}; expected train, restval, "
                        "val or test")
    folder = image_root(dataset_dir)
    check_files_exist((folder / image.path for image in images), str(json_path))
    return dataset_dir, images


def load_coco(root: str | Path, *, noise_ratio: float = 0.0, seed: int = 0,
              noise_file: str | Path | None = None,
              cache_dir: str | Path | None = None) -> dict[str, RetrievalData]:
    """{"train", "val", "test"} Karpathy splits; train captions noisy when noise_ratio > 0.

    The noise index is read from / written to `noise_file`, by default
    `<cache_dir or coco folder>/noise_index/coco_noise{r}_seed{s}.npy`.
    """
    dataset_dir, images = check_coco_files(root)
    folder = image_root(dataset_dir)
    splits = {name: to_retrieval([im for im in images if im.split in members], folder)
              for name, members in SPLITS.items()}
    if noise_ratio > 0:
        path = Path(noise_file) if noise_file else default_noise_path(
            Path(cache_dir) if cache_dir else dataset_dir, "coco", noise_ratio, seed)
        train = splits["train"]
        train.caption_to_image = noisy_caption_to_image(train.caption_to_image, noise_ratio, seed,
                                                        path).tolist()
    return splits

