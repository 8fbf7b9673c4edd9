"""ViT-B/32 at its real shapes, through the real `vacsr train` / `vacsr eval` entry points.

The tiny model (32 px, 16 patches, 16-token context, 64 wide, 3 blocks) hides anything tied to
the shapes of the real backbones: 224 px inputs resized by open_clip's preprocessing, 49 patches +
the class token, the 77-token text context, 768-wide image / 512-wide text towers, GPO over those
token counts and trainable-block counts out of 12. ViT-B/32 has them all and is the cheaper of the
two backbones the paper (arXiv 2605.30968) uses. Its weights are random (no download): they are
saved as a local weights file, the path a user's own checkpoint takes through model.pretrained.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import open_clip
import pytest
import torch
from PIL import Image

from vacsr.cli import main
from vacsr.data.generate import generate, write_coco

pytestmark = pytest.mark.slow

EMBED_DIM = 512  # ViT-B-32's joint embedding: the adapter's input width
ON_DISK_SIZE = 32  # synthetic images stay small; the model's preprocessing resizes them to 224


@pytest.fixture(scope="module")
def vit_b32_weights(tmp_path_factory) -> Path:
    """Random ViT-B-32 weights as an open_clip state dict file (what model.pretrained reads)."""
    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32", pretrained=None)
    assert model.visual.positional_embedding.shape == (50, 768)  # 7 x 7 patches + class token
    assert model.positional_embedding.shape == (77, 512)  # text context x text width
    assert len(model.visual.transformer.resblocks) == len(model.transformer.resblocks) == 12
    path = tmp_path_factory.mktemp("weights") / "vit-b-32-random.pt"
    torch.save(model.state_dict(), path)
    return path


def _run(capsys, *argv: str) -> str:
    """`vacsr ARGV` in this process; returns its stdout, failing with its stderr otherwise."""
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    return out.out


def _common(weights: Path, output_dir: Path, batch_size: int) -> list[str]:
    """One epoch of a few steps; the test split is left to `vacsr eval`."""
    return ["model.name=ViT-B-32", f"model.pretrained={weights}", f"train.output_dir={output_dir}",
            "train.epochs=1", f"train.batch_size={batch_size}", "train.eval_test=false",
            "train.progress=false", "data.augment=false", "adapter.hidden_dim=64"]


def _checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _assert_trained(checkpoint: dict, steps: int) -> dict:
    """Finite losses, the adapter reading 512-wide features, and the returned metrics."""
    final = checkpoint["history"][-1]
    assert math.isfinite(final["train/loss"]), final
    assert checkpoint["model"]["head.fc1.weight"].shape == (64, EMBED_DIM)
    state = checkpoint["optimizer"]["state"]
    assert state and all(int(s["step"]) == steps for s in state.values())
    return final


def _assert_blocks_moved(checkpoint: dict, weights: Path, expected: dict) -> None:
    """{(tower, block): trained?}: a trained block's weights differ from the weights file's, a
    frozen one's are identical."""
    start = torch.load(weights, map_location="cpu", weights_only=True)
    for (tower, block), trained in expected.items():
        key = f"{tower}.resblocks.{block}.mlp.c_fc.weight"
        moved = not torch.equal(checkpoint["model"][f"backbone.clip.{key}"], start[key])
        assert moved == trained, key


def test_retrieval_with_gpo_trains_and_evaluates(tmp_path, capsys, vit_b32_weights):
    # 2 train images x 5 captions = 10 pairs: 2 steps of 4 (the partial batch is dropped)
    write_coco(tmp_path / "data", num_train=2, num_restval=0, num_val=1, num_test=5,
               size=ON_DISK_SIZE)
    image = next((tmp_path / "data" / "coco" / "images").rglob("*.jpg"))
    assert Image.open(image).size == (ON_DISK_SIZE, ON_DISK_SIZE)
    run = tmp_path / "retrieval"
    _run(capsys, "train", *_common(vit_b32_weights, run, 4), "data.task=retrieval",
         "data.dataset=coco", f"data.root={tmp_path / 'data'}", "model.use_gpo=true",
         "model.trainable_image_blocks=12", "model.trainable_text_blocks=12")
    checkpoint = _checkpoint(run / "last.ckpt")
    final = _assert_trained(checkpoint, steps=2)
    for part in ("recon", "kl", "sigma_pos", "sigma_neg"):
        assert math.isfinite(final[f"train/{part}"]), part
    # all 12 blocks of both towers trained: the first and the last moved away from the file's
    _assert_blocks_moved(checkpoint, vit_b32_weights, {("visual.transformer", 0): True,
                                                       ("visual.transformer", 11): True,
                                                       ("transformer", 0): True,
                                                       ("transformer", 11): True})
    assert checkpoint["model"]["backbone.image_gpo.score.weight"].shape == (1, 32)

    out = _run(capsys, "eval", "--checkpoint", str(run / "last.ckpt"))
    assert "rsum" in out
    metrics = json.loads((run / "eval-coco-base-test.json").read_text())["metrics"]
    for key in ("i2t_r1", "i2t_r5", "t2i_r1", "t2i_r10"):
        assert 0 <= metrics[key] <= 100, key
    assert 0 <= metrics["rsum"] <= 600
    assert 0 < metrics["sigma_top1_i2t_mean"] < 1


def test_classification_with_prompts_trains_and_evaluates(tmp_path, capsys, vit_b32_weights):
    # EuroSAT's 10 classes: 5 base classes x 1 shot = 5 images, 2 steps of 2 against 5 prompts
    generate(tmp_path / "data", "eurosat", size=ON_DISK_SIZE, per_class=(1, 1, 1))
    run = tmp_path / "classification"
    # the domain-generalisation protocol's first 2 image and 3 text blocks (appendix C.2)
    _run(capsys, "train", *_common(vit_b32_weights, run, 2), "data.task=classification",
         "data.dataset=eurosat", f"data.root={tmp_path / 'data'}", "data.shots=1",
         "model.use_gpo=false", "model.trainable_image_blocks=2", "model.trainable_text_blocks=3")
    checkpoint = _checkpoint(run / "last.ckpt")
    final = _assert_trained(checkpoint, steps=2)
    assert 0 <= final["val/acc"] <= 100
    assert checkpoint["model"]["backbone.clip.transformer.resblocks.2.attn.in_proj_weight"].shape \
        == (3 * 512, 512)  # the 512-wide text tower (the image tower is 768 wide)
    _assert_blocks_moved(checkpoint, vit_b32_weights, {("visual.transformer", 1): True,
                                                       ("visual.transformer", 2): False,
                                                       ("transformer", 2): True,
                                                       ("transformer", 3): False})

    # zero-shot novel classes (base-to-novel), from the base-trained checkpoint
    _run(capsys, "eval", "--checkpoint", str(run / "last.ckpt"), "data.subsample_classes=novel")
    metrics = json.loads((run / "eval-eurosat-novel-test.json").read_text())["metrics"]
    assert 0 <= metrics["acc"] <= 100


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_vit_b16_gpo_features_in_bf16_match_fp32_on_cuda():
    """ViT-B/16's 197 image tokens and 77 text tokens through GPO under bf16 autocast (training's
    precision on CUDA): features close to fp32 ones, finite gradients into the first block."""
    from vacsr.model.backbone import ClipBackbone

    torch.manual_seed(0)
    backbone = ClipBackbone(name="ViT-B-16", use_gpo=True).cuda()
    images = torch.randn(8, 3, 224, 224, device="cuda")
    tokens = backbone.tokenize([f"a photo of {n} red circles on the left" for n in range(8)])
    tokens = tokens.cuda()
    assert backbone.image_tokens(images).shape == (8, 197, EMBED_DIM)
    with torch.no_grad():
        reference = backbone.encode_image(images), backbone.encode_text(tokens)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        features = backbone.encode_image(images), backbone.encode_text(tokens)
    for low, high in zip(features, reference):
        assert low.shape == (8, EMBED_DIM)
        assert torch.nn.functional.cosine_similarity(low.float(), high).min() > 0.98
    (features[0].float().sum() + features[1].float().sum()).backward()
    for tower in (backbone.clip.visual.transformer, backbone.clip.transformer):
        grad = tower.resblocks[0].mlp.c_fc.weight.grad
        assert grad is not None and torch.isfinite(grad).all()
