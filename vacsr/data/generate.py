"""Write small synthetic datasets in every real on-disk layout the loaders read.

Each layout is the real one (CoOp's split JSONs, Aircraft's text files, ImageNet's wnid folders and
classnames.txt, V2's numbered folders, A/R's 200 wnid folders, Karpathy's dataset_coco.json), with
each dataset's real class count, so that every loader and the base/novel arithmetic run for real in
tests and in the demo. Images are tiny; their content encodes the class (a coloured shape on one
side, plus for labels >= 64 a coloured band along one edge: 1,024 distinct codes) or, for COCO, the
scene the captions describe, so a model trained on them learns something measurable.

Class names are synthetic words from the code ("red circle left blue top band"), written in each
dataset's naming style (EuroSAT uses its real ten classes and CoOp's renames).
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable

from PIL import Image, ImageDraw, ImageOps

from vacsr.atomic import require_writable_folder
from vacsr.data.classification import DATASETS
from vacsr.data.coco import GROUP_FIELD
from vacsr.data.synthetic import Scene, all_scenes, captions_for, render, scene_index
from vacsr.data.synthetic_layout import (
    IMAGENET_1K,
    VARIANT_PER_CLASS,
    SyntheticSizes,
    class_total,
    image_suffix,
    images_per_class,
    variant_labels,
)
from vacsr.errors import ConfigError

BAND_COLORS = {"cyan": (0, 200, 200), "brown": (120, 70, 20), "navy": (10, 10, 110),
               "lime": (150, 250, 60)}
BAND_EDGES = ("top", "bottom", "left", "right")
EUROSAT = {"AnnualCrop": "Annual Crop Land", "Forest": "Forest",
           "HerbaceousVegetation": "Herbaceous Vegetation Land", "Highway": "Highway or Road",
           "Industrial": "Industrial Buildings", "Pasture": "Pasture Land",
           "PermanentCrop": "Permanent Crop Land", "Residential": "Residential Buildings",
           "River": "River", "SeaLake": "Sea or Lake"}
CALTECH_RENAMES = {"airplanes": "airplane", "Faces": "face", "Leopards": "leopard",
                   "Motorbikes": "motorbike"}
CALTECH_IGNORED = ("BACKGROUND_Google", "Faces_easy")  # folders CoOp leaves out of the split


# ---------------------------------------------------------------- class codes and images
def class_words(label: int) -> list[str]:
    """Words naming class `label`: scene (64 codes) then, for label >= 64, a band (16 codes)."""
    scene = all_scenes()[label % 64]
    words = [scene.color, scene.shape, scene.side]
    variant = label // 64
    if variant >= 16:
        raise ValueError(f"class code {label} exceeds the 1,024 synthetic codes")
    if variant:
        words += [list(BAND_COLORS)[(variant - 1) // 4], BAND_EDGES[(variant - 1) % 4], "band"]
    return words


def class_image(label: int, size: int, rng: random.Random) -> Image.Image:
    """A jittered image whose pixels encode `label` (see class_words)."""
    words = class_words(label)
    image = render(Scene(*words[:3]), size, rng)
    if len(words) > 3:
        width = max(2, size // 8)
        box = {"top": (0, 0, size, width), "bottom": (0, size - width, size, size),
               "left": (0, 0, width, size), "right": (size - width, 0, size, size)}[words[4]]
        ImageDraw.Draw(image).rectangle(box, fill=BAND_COLORS[words[3]])
    return image


def shifted(image: Image.Image, domain: str, rng: random.Random) -> Image.Image:
    """A mild domain shift for the ImageNet variants (the class code stays visible)."""
    if domain == "sketch":
        return Image.blend(image, ImageOps.grayscale(image).convert("RGB"), 0.6)
    if domain == "adversarial":
        noise = Image.effect_noise(image.size, 40).convert("RGB")
        return Image.blend(image, noise, 0.25 + 0.1 * rng.random())
    if domain == "rendition":
        return ImageOps.posterize(image, 2)
    return image


def save(image: Image.Image, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() in (".jpg", ".jpeg"):
        image.save(path, format="JPEG", quality=95)
    else:
        image.save(path, format="PNG")


# ---------------------------------------------------------------- naming styles per dataset
def _camel(words: list[str]) -> str:
    return "".join(w.capitalize() for w in words)


# dataset -> (folder name of class, stored class name, image path under the image folder)
Naming = tuple[Callable[[int, list[str]], str], Callable[[int, list[str]], str],
               Callable[[str, str, int, int], str]]


def _caltech_folder(label: int, words: list[str]) -> str:
    special = list(CALTECH_RENAMES)
    return special[label] if label < len(special) else "_".join(words)


def _caltech_name(label: int, words: list[str]) -> str:
    folder = _caltech_folder(label, words)
    return CALTECH_RENAMES.get(folder, folder)


NAMING: dict[str, Naming] = {
    "caltech101": (_caltech_folder, _caltech_name,
                   lambda folder, split, lab, n: f"{folder}/image_{n:04d}.png"),
    # Pets file names start with the breed (cats capitalised); CoOp lower-cases it.
    "oxford_pets": (lambda lab, w: "_".join(w).capitalize() if lab % 2 else "_".join(w),
                    lambda lab, w: "_".join(w),
                    lambda folder, split, lab, n: f"{folder}_{n}.png"),
    "stanford_cars": (lambda lab, w: "", lambda lab, w: f"{2000 + lab % 13} " + " ".join(
                          x.capitalize() for x in w),
                      lambda folder, split, lab, n:
                      f"cars_{'test' if split == 'test' else 'train'}/{lab * 100 + n:05d}.png"),
    "oxford_flowers": (lambda lab, w: "", lambda lab, w: " ".join(w),
                       lambda folder, split, lab, n: f"image_{lab * 100 + n + 1:05d}.png"),
    "food101": (lambda lab, w: "_".join(w), lambda lab, w: "_".join(w),
                lambda folder, split, lab, n: f"{folder}/{lab * 1000 + n}.png"),
    "sun397": (lambda lab, w: f"{w[0][0]}/{'_'.join(w[:-1])}/{w[-1]}",
               # CoOp: drop the letter, reverse the rest ("a/apse/indoor" -> "indoor apse")
               lambda lab, w: f"{w[-1]} {'_'.join(w[:-1])}",
               lambda folder, split, lab, n: f"{folder}/sun_{lab:03d}{n:04d}.png"),
    "dtd": (lambda lab, w: "".join(w), lambda lab, w: "".join(w),
            lambda folder, split, lab, n: f"{folder}/{folder}_{n:04d}.png"),
    "eurosat": (lambda lab, w: list(EUROSAT)[lab], lambda lab, w: list(EUROSAT.values())[lab],
                lambda folder, split, lab, n: f"{folder}/{folder}_{n + 1}.png"),
    "ucf101": (lambda lab, w: _camel(w), lambda lab, w: "_".join(x.capitalize() for x in w),
               lambda folder, split, lab, n: f"{folder}/v_{folder}_g{n + 1:02d}_c01.png"),
}


# ---------------------------------------------------------------- writers, one per layout
def write_split_dataset(root: str | Path, name: str, *, seed: int = 0, train_per_class: int = 4,
                        val_per_class: int = 3, test_per_class: int = 2,
                        size: int = 32) -> Path:
    """A split-JSON dataset (the ten besides Aircraft and ImageNet); returns its folder."""
    spec, (folder_of, name_of, path_of) = DATASETS[name], NAMING[name]
    rng = random.Random(f"{seed}-{name}")
    dataset_dir = Path(root) / spec.folder
    image_dir = dataset_dir / spec.image_dir if spec.image_dir else dataset_dir
    counts = {"train": train_per_class, "val": val_per_class, "test": test_per_class}
    split: dict[str, list] = {key: [] for key in counts}
    for label in range(spec.num_classes):
        words = class_words(label)
        folder, classname = folder_of(label, words), name_of(label, words)
        offset = 0
        for key, count in counts.items():
            for n in range(offset, offset + count):
                relpath = path_of(folder, key, label, n)
                save(class_image(label, size, rng), image_dir / relpath)
                split[key].append([relpath, label, classname])
            offset += count
    if name == "caltech101":
        for ignored in CALTECH_IGNORED:  # present on disk, absent from the split (as in CoOp)
            save(class_image(0, size, rng), image_dir / ignored / "image_0001.png")
    (dataset_dir / spec.split_file).write_text(json.dumps(split))
    return dataset_dir


def write_aircraft(root: str | Path, *, seed: int = 0, train_per_class: int = 4,
                   val_per_class: int = 3, test_per_class: int = 2, size: int = 32) -> Path:
    """fgvc_aircraft/variants.txt, images_variant_{train,val,test}.txt and images/<id>.jpg."""
    rng = random.Random(f"{seed}-fgvc_aircraft")
    dataset_dir = Path(root) / "fgvc_aircraft"
    variants = synthetic_classnames("fgvc_aircraft")
    dataset_dir.mkdir(parents=True, exist_ok=True)
    (dataset_dir / "variants.txt").write_text("\n".join(variants) + "\n")
    image_id = 1_000_000
    for split, count in (("train", train_per_class), ("val", val_per_class),
                         ("test", test_per_class)):
        lines = []
        for label, variant in enumerate(variants):
            for _ in range(count):
                image_id += 1
                save(class_image(label, size, rng), dataset_dir / "images" / f"{image_id}.jpg")
                lines.append(f"{image_id} {variant}")
        (dataset_dir / f"images_variant_{split}.txt").write_text("\n".join(lines) + "\n")
    return dataset_dir


def synthetic_classnames(name: str, imagenet_classes: int = IMAGENET_1K) -> list[str]:
    """The class names, by label, of generated classification dataset `name` as its files name
    them (a split dataset's split JSON, Aircraft's variants.txt, ImageNet's classnames.txt)."""
    count = class_total(name, imagenet_classes)
    if name == "imagenet":
        return imagenet_classnames(count)
    if name == "fgvc_aircraft":  # real variants hold spaces, dashes and slashes ("F/A-18")
        return [f"{w[0].capitalize()}-{w[1]}/{w[2]} {' '.join(w[3:])}".strip()
                for w in map(class_words, range(count))]
    name_of = NAMING[name][1]
    return [name_of(label, class_words(label)) for label in range(count)]


def imagenet_wnids(count: int = IMAGENET_1K) -> list[str]:
    """Synthetic wnids whose sorted order is the label order, as with real ImageNet."""
    return [f"n{1_440_000 + 7_919 * label:08d}" for label in range(count)]


def imagenet_classnames(count: int = IMAGENET_1K) -> list[str]:
    return [" ".join(class_words(label)) for label in range(count)]


def _classnames_text(count: int = IMAGENET_1K) -> str:
    return "".join(f"{w} {n}\n" for w, n in zip(imagenet_wnids(count), imagenet_classnames(count)))


def write_imagenet(root: str | Path, *, seed: int = 0, train_per_class: int = 4,
                   test_per_class: int = 1, size: int = 32, classes: int = IMAGENET_1K) -> Path:
    """imagenet/classnames.txt and images/{train,val}/<wnid>/*.JPEG-style files (PNG content), of
    ImageNet-1k's 1,000 classes or a smaller ImageNet's `classes` (vacsr/data/imagenet.py)."""
    rng = random.Random(f"{seed}-imagenet")
    dataset_dir = Path(root) / "imagenet"
    dataset_dir.mkdir(parents=True, exist_ok=True)
    (dataset_dir / "classnames.txt").write_text(_classnames_text(classes))
    for label, wnid in enumerate(imagenet_wnids(classes)):
        for n in range(train_per_class):
            save(class_image(label, size, rng),
                 dataset_dir / "images" / "train" / wnid / f"{wnid}_{n}.png")
        for n in range(test_per_class):
            save(class_image(label, size, rng),
                 dataset_dir / "images" / "val" / wnid / f"ILSVRC2012_val_{label:05d}{n}.png")
    return dataset_dir


def write_imagenet_variant(root: str | Path, name: str, *, seed: int = 0,
                           per_class: int = VARIANT_PER_CLASS, size: int = 32,
                           classes: int = IMAGENET_1K) -> Path:
    """imagenetv2 (folders 0..999), imagenet-sketch (1000 wnids), -adversarial / -rendition
    (200 wnids each, different subsets), each with its copy of classnames.txt; of a smaller
    ImageNet of `classes` classes, the same shares of them."""
    from vacsr.data.imagenet import VARIANTS
    folder, image_sub, _ = VARIANTS[name]
    domain = {"imagenetv2": "v2", "imagenet_sketch": "sketch", "imagenet_a": "adversarial",
              "imagenet_r": "rendition"}[name]
    rng = random.Random(f"{seed}-{name}")
    dataset_dir = Path(root) / folder
    image_dir = dataset_dir / image_sub
    dataset_dir.mkdir(parents=True, exist_ok=True)
    (dataset_dir / "classnames.txt").write_text(_classnames_text(classes))
    wnids = imagenet_wnids(classes)
    for label in variant_labels(name, classes):
        class_dir = image_dir / (str(label) if name == "imagenetv2" else wnids[label])
        for n in range(per_class):
            image = shifted(class_image(label, size, rng), domain, rng)
            save(image, class_dir / f"{domain}_{n}.png")
    if name == "imagenet_a":
        (image_dir / "README.txt").write_text("ImageNet-A (synthetic stand-in)\n")
    return dataset_dir


def write_coco(root: str | Path, *, seed: int = 0, num_train: int = 40, num_restval: int = 10,
               num_val: int = 10, num_test: int = 25, size: int = 32) -> Path:
    """coco/dataset_coco.json (Karpathy format) + coco/images/{train2014,val2014}/*.jpg.

    Each image entry also has `"scene"` (vacsr.data.coco.GROUP_FIELD), its scene index: captions
    describe only the scene, so that is the extended ground truth the loader hands to evaluation.
    """
    rng = random.Random(f"{seed}-coco")
    dataset_dir = Path(root) / "coco"
    scenes = all_scenes()
    entries, sentid = [], 700_000
    plan = (["train"] * num_train + ["restval"] * num_restval + ["val"] * num_val
            + ["test"] * num_test)
    cocoids = rng.sample(range(1, 600_000), len(plan))
    for imgid, (split, cocoid) in enumerate(zip(plan, cocoids)):
        scene = rng.choice(scenes)
        subset = "train2014" if split == "train" else "val2014"
        filename = f"COCO_{subset}_{cocoid:012d}.jpg"
        save(render(scene, size, rng), dataset_dir / "images" / subset / filename)
        # Some real COCO images have 6-7 captions; the loader keeps the first five.
        texts = captions_for(scene, 6 if imgid % 7 == 3 else 5, rng)
        sentences = []
        for raw in texts:
            sentid += rng.randint(1, 50)
            sentences.append({"tokens": raw.split(), "raw": raw + " ", "imgid": imgid,
                              "sentid": sentid})
        entries.append({"filepath": subset, "filename": filename, "imgid": imgid, "split": split,
                        "cocoid": cocoid, "sentids": [s["sentid"] for s in sentences],
                        "sentences": sentences, GROUP_FIELD: scene_index(scene)})
    (dataset_dir / "dataset_coco.json").write_text(json.dumps({"images": entries,
                                                               "dataset": "coco"}))
    return dataset_dir


SPLIT_DATASETS = tuple(NAMING)
ALL_DATASETS = ("coco",) + SPLIT_DATASETS + ("fgvc_aircraft", "imagenet", "imagenetv2",
                                             "imagenet_sketch", "imagenet_a", "imagenet_r")


def generate(root: str | Path, name: str, *, seed: int = 0, size: int = 32,
             per_class: tuple[int, int, int] = (4, 3, 2),
             imagenet_classes: int = IMAGENET_1K) -> Path:
    """Write one dataset (any name of ALL_DATASETS) under `root`; returns its folder.

    `per_class` = (train, val, test) images per class of the classification datasets, as
    synthetic_layout.images_per_class adjusts them (ImageNet: no val split); the variants get
    one image per class. ImageNet and its variants hold `imagenet_classes` of ImageNet-1k's
    classes (the variants their share of them).
    """
    train, val, test = images_per_class(name, per_class)
    if name == "coco":
        return write_coco(root, seed=seed, size=size)
    if name == "fgvc_aircraft":
        return write_aircraft(root, seed=seed, size=size, train_per_class=train,
                              val_per_class=val, test_per_class=test)
    if name == "imagenet":
        return write_imagenet(root, seed=seed, size=size, train_per_class=train,
                              test_per_class=test, classes=imagenet_classes)
    if name in SPLIT_DATASETS:
        return write_split_dataset(root, name, seed=seed, size=size, train_per_class=train,
                                   val_per_class=val, test_per_class=test)
    if name in ("imagenetv2", "imagenet_sketch", "imagenet_a", "imagenet_r"):
        return write_imagenet_variant(root, name, seed=seed, size=size, classes=imagenet_classes)
    raise ValueError(f"unknown dataset {name!r} (known: {', '.join(ALL_DATASETS)})")


def generate_all(root: str | Path, *, seed: int = 0, size: int = 32,
                 datasets: tuple[str, ...] | list[str] | None = None,
                 per_class: tuple[int, int, int] = (4, 3, 2),
                 imagenet_classes: int = IMAGENET_1K) -> Path:
    """Write every layout (or the named ones: none for an empty list, as a retrieval sweep on
    its in-memory `synthetic` data asks) under `root`, ready to be used as data.root."""
    root = Path(root)
    names = list(ALL_DATASETS if datasets is None else datasets)
    unknown = [name for name in names if name not in ALL_DATASETS]
    if unknown:
        raise ConfigError(f"unknown dataset {unknown[0]!r} (known: {', '.join(ALL_DATASETS)})")
    if not 1 <= imagenet_classes <= IMAGENET_1K:
        raise ConfigError(f"imagenet_classes {imagenet_classes}: expected 1 to {IMAGENET_1K} "
                          "(a subset of ImageNet-1k's classes)")
    require_writable_folder(root, "the synthetic datasets")
    for name in names:
        generate(root, name, seed=seed, size=size, per_class=per_class,
                 imagenet_classes=imagenet_classes)
    return root


def generate_sizes(root: str | Path, sizes: SyntheticSizes, *,
                   datasets: tuple[str, ...] | list[str] | None = None) -> Path:
    """generate_all at `sizes` (a sweep's embedded profile's)."""
    return generate_all(root, datasets=datasets, per_class=sizes.per_class,
                        imagenet_classes=sizes.imagenet_classes)


def write_samples(root: str | Path, name: str, count: int, *, seed: int = 0,
                  size: int = 32) -> tuple[str, ...]:
    """An image of each of the first `count` classes of classification dataset `name`, drawn,
    sized and stored as generate() stores that layout's, and nothing else: the few files a
    plan's calibration decodes (and its kept costs are keyed by their format and size) where
    the whole layout is not needed (vacsr/sweep/cost/measure.py)."""
    rng = random.Random(f"{seed}-{name}-samples")
    folder = Path(root) / name
    paths = []
    for label in range(min(count, DATASETS[name].num_classes)):
        path = folder / f"class_{label:04d}{image_suffix(name)}"
        save(class_image(label, size, rng), path)
        paths.append(str(path))
    return tuple(paths)


__all__ = ["ALL_DATASETS", "class_image", "class_words", "generate", "generate_all",
           "write_aircraft", "write_coco", "write_imagenet", "write_imagenet_variant",
           "write_samples", "write_split_dataset"]
