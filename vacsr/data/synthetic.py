"""Synthetic image-text data whose pixels depend on the caption's words.

Each image shows one coloured shape on one side of a plain background; its captions name the colour,
the shape and the side in varied wording. A model that reads colour, shape and position can match
them, so training on this data is meaningful (R@1 far above chance), yet it needs no download.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

from vacsr.data.base import ClassificationData, RetrievalData

COLORS = {
    "red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (235, 215, 30),
    "purple": (140, 40, 170), "orange": (245, 140, 20), "white": (245, 245, 245),
    "black": (15, 15, 15),
}
SHAPES = ("circle", "square", "triangle", "cross")
SIDES = ("left", "right")
CAPTION_TEMPLATES = (
    "a {color} {shape} on the {side}",
    "there is a {shape} colored {color} at the {side}",
    "the {side} side shows a {color} {shape}",
    "a {shape} in {color} placed {side}",
    "{color} {shape} {side}",
    "a picture of a {color} {shape} on the {side} side",
)


@dataclass(frozen=True)
class Scene:
    """What one synthetic image shows."""

    color: str
    shape: str
    side: str

    @property
    def classname(self) -> str:
        return f"{self.color}_{self.shape}"


def all_scenes() -> list[Scene]:
    return [Scene(c, s, p) for c in COLORS for s in SHAPES for p in SIDES]


def scene_index(scene: Scene) -> int:
    """Position of `scene` in all_scenes(): its semantic group (same scene = same captions)."""
    return (list(COLORS).index(scene.color) * len(SHAPES) + SHAPES.index(scene.shape)) \
        * len(SIDES) + SIDES.index(scene.side)


def render(scene: Scene, size: int, rng: random.Random) -> Image.Image:
    """Draw `scene` with random jitter in size, position and background tint."""
    tint = rng.randint(100, 150)
    image = Image.new("RGB", (size, size), (tint, tint, tint))
    draw = ImageDraw.Draw(image)
    radius = size * rng.uniform(0.18, 0.26)
    cx = size * (0.27 if scene.side == "left" else 0.73) + rng.uniform(-0.05, 0.05) * size
    cy = size * 0.5 + rng.uniform(-0.2, 0.2) * size
    color = COLORS[scene.color]
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    if scene.shape == "circle":
        draw.ellipse(box, fill=color)
    elif scene.shape == "square":
        draw.rectangle(box, fill=color)
    elif scene.shape == "triangle":
        draw.polygon([(cx, cy - radius), (cx - radius, cy + radius), (cx + radius, cy + radius)],
                     fill=color)
    else:
        bar = radius / 3
        draw.rectangle((cx - radius, cy - bar, cx + radius, cy + bar), fill=color)
        draw.rectangle((cx - bar, cy - radius, cx + bar, cy + radius), fill=color)
    return image


def captions_for(scene: Scene, count: int, rng: random.Random) -> list[str]:
    templates = rng.sample(CAPTION_TEMPLATES, k=min(count, len(CAPTION_TEMPLATES)))
    while len(templates) < count:
        templates.append(rng.choice(CAPTION_TEMPLATES))
    return [t.format(color=scene.color, shape=scene.shape, side=scene.side) for t in templates]


def synthetic_retrieval(num_images: int, *, captions_per_image: int = 5, image_size: int = 32,
                        seed: int = 0, id_offset: int = 0) -> RetrievalData:
    """`num_images` random scenes with `captions_per_image` captions each (5 consecutive).

    Captions describe only the scene, so images of the same scene are true false negatives of each
    other's captions: image_groups holds each image's scene index (into all_scenes()).
    """
    rng = random.Random(seed)
    scenes = all_scenes()
    images, captions, caption_to_image, image_groups = [], [], [], []
    for index in range(num_images):
        scene = rng.choice(scenes)
        image_groups.append(scene_index(scene))
        images.append(render(scene, image_size, rng))
        for caption in captions_for(scene, captions_per_image, rng):
            captions.append(caption)
            caption_to_image.append(index)
    image_ids = [id_offset + i for i in range(num_images)]
    caption_ids = [id_offset * 10 + j for j in range(len(captions))]
    return RetrievalData(images=images, captions=captions, caption_to_image=caption_to_image,
                         image_ids=image_ids, caption_ids=caption_ids, image_groups=image_groups)


def synthetic_classification(per_class: int, *, classnames: list[str] | None = None,
                             image_size: int = 32, seed: int = 0,
                             template: str = "a photo of a {}.") -> ClassificationData:
    """`per_class` images of each colour-shape class (side drawn at random)."""
    rng = random.Random(seed)
    classnames = classnames or sorted({s.classname for s in all_scenes()})
    images, labels = [], []
    for label, name in enumerate(classnames):
        color, shape = name.split("_")
        for _ in range(per_class):
            images.append(render(Scene(color, shape, rng.choice(SIDES)), image_size, rng))
            labels.append(label)
    return ClassificationData(images=images, labels=labels, classnames=classnames,
                              template=template)
