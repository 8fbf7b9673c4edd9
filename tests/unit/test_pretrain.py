"""The tiny CLIP's pretraining (vacsr/model/pretrain.py): its pairs as tensors, its batched crops,
and weights that tell the synthetic scenes apart."""
from __future__ import annotations

import torch

from vacsr.data.base import load_image
from vacsr.data.synthetic import all_scenes, synthetic_retrieval
from vacsr.model.backbone import create_clip
from vacsr.model.pretrain import PairTensors
from vacsr.model.weights import random_init_expected


def _pairs(num_images: int = 6):
    with random_init_expected():
        model, train_transform, eval_transform, tokenizer = create_clip("vacsr-tiny")
    data = synthetic_retrieval(num_images, captions_per_image=5, image_size=32, seed=3)
    return data, PairTensors(data, tokenizer, train_transform, model.visual.preprocess_cfg), \
        eval_transform, tokenizer


def test_a_batch_holds_its_pairs_captions_and_images():
    data, pairs, eval_transform, tokenizer = _pairs()
    picked = torch.tensor([7, 0, 29, 12])
    pairs.scale, pairs.log_ratio = (1.0, 1.0), (0.0, 0.0)  # the crop of the whole image
    images, tokens, image_index = pairs.batch(picked, torch.Generator().manual_seed(0))
    assert image_index.tolist() == [data.caption_to_image[i] for i in picked.tolist()]
    assert torch.equal(tokens, tokenizer([data.captions[i] for i in picked.tolist()]))
    # the whole image, normalised as the model's own preprocessing does it
    expected = torch.stack([eval_transform(load_image(data.images[i])) for i in image_index])
    torch.testing.assert_close(images, expected, atol=1e-5, rtol=0)


def test_crops_are_drawn_per_image_from_the_seed():
    _, pairs, _, _ = _pairs()
    picked = torch.arange(20)
    first, _, _ = pairs.batch(picked, torch.Generator().manual_seed(1))
    again, _, _ = pairs.batch(picked, torch.Generator().manual_seed(1))
    other, _, _ = pairs.batch(picked, torch.Generator().manual_seed(2))
    assert first.shape == (20, 3, 32, 32) and torch.isfinite(first).all()
    assert torch.equal(first, again) and not torch.equal(first, other)
    # captions 0..4 share image 0: each gets a crop of its own, all close to the image
    assert all(not torch.equal(first[i], first[j]) for i in range(5) for j in range(i))
    assert (first[0] - first[1]).abs().mean() < first[0].abs().mean()


def test_the_pretrained_tiny_clip_tells_the_scenes_apart(tiny_weights):
    """What the demo and the tests rely on: from the weights the recipe writes, a caption finds
    an image of its scene (and back) far more often than the 1 in 64 of chance."""
    model, _, eval_transform, tokenizer = create_clip("vacsr-tiny", pretrained=str(tiny_weights))
    model.eval()
    held_out = synthetic_retrieval(200, captions_per_image=5, image_size=32, seed=4242)
    with torch.no_grad():
        image_feats = model.encode_image(torch.stack([eval_transform(load_image(i))
                                                      for i in held_out.images]), normalize=True)
        text_feats = model.encode_text(tokenizer(held_out.captions), normalize=True)
    similarity = image_feats @ text_feats.T  # (images, captions)
    scene = torch.tensor(held_out.image_groups)  # (images,)
    caption_scene = scene[torch.tensor(held_out.caption_to_image)]  # (captions,)
    image_to_text = (caption_scene[similarity.argmax(1)] == scene).float().mean()
    text_to_image = (scene[similarity.argmax(0)] == caption_scene).float().mean()
    assert len(all_scenes()) == 64
    assert image_to_text > 0.6 and text_to_image > 0.6, (image_to_text, text_to_image)
