"""The methods that score image-caption retrieval beside VACSR and the sigmoid baseline
(vacsr/methods/): zero-shot CLIP is open_clip's own similarity matrix and recalls, noisy training
pairs or not; CLIP's contrastive fine-tuning has CLIP's symmetric InfoNCE (soft targets where a row
holds several positives) and trains its temperature, clipped at log 100. The tiny CLIP has random
weights; the data is the synthetic retrieval split (10 test images, 5 captions each)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vacsr.cli import main
from vacsr.config import load_config
from vacsr.data.base import load_image
from vacsr.methods.registry import METHODS
from vacsr.model.backbone import create_clip
from vacsr.model.clip_heads import MAX_LOGIT_SCALE, ContrastiveHead, contrastive_loss
from vacsr.train.checkpoint import load_checkpoint
from vacsr.train.eval_pass import encode_checkpoint, evaluate_checkpoint
from vacsr.train.loop import Trainer, train

pytestmark = pytest.mark.timeout(300)


def _protocol(kind: str) -> list[str]:
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}"
            for key, value in METHODS[kind].protocol.items()]


def _overrides(out: Path, weights: Path, kind: str, *extra: str) -> list[str]:
    return [f"model.pretrained={weights}", f"train.output_dir={out}", "train.resume=false",
            "train.progress=false", "train.device=cpu", "data.task=retrieval",
            "data.dataset=synthetic", "data.num_train=8", "data.num_test=10",
            "train.batch_size=4", "train.epochs=1", "optim.lr=0.05", "optim.schedule=constant",
            f"adapter.kind={kind}", *_protocol(kind), *extra]


def _config(out: Path, weights: Path, kind: str, *extra: str):
    return load_config(overrides=_overrides(out, weights, kind, *extra))


# ---------------------------------------------------------------- zero-shot CLIP


@torch.no_grad()
def _clip_similarities(weights: Path, data) -> torch.Tensor:
    """open_clip's own (images x captions) exp(t) cos: its eval transform, encode_image /
    encode_text (normalised)."""
    clip, _, eval_transform, tokenizer = create_clip("vacsr-tiny", str(weights))
    clip.eval()
    images = torch.stack([eval_transform(load_image(ref)) for ref in data.images])
    image = clip.encode_image(images, normalize=True)  # (N_i, d)
    text = clip.encode_text(tokenizer(list(data.captions)), normalize=True)  # (N_c, d)
    return clip.logit_scale.exp() * image @ text.T


def _recalls(sims: torch.Tensor, caption_to_image) -> dict[str, float]:
    """R@1/5/10 both ways and RSUM, by their definition: an image is found when one of its
    captions ranks in its top K, a caption when its image does."""
    owner = torch.as_tensor(caption_to_image)  # (N_c,)
    metrics = {}
    for k in (1, 5, 10):
        top_captions = sims.topk(k, dim=1).indices  # (N_i, k)
        hits = (owner[top_captions] == torch.arange(sims.shape[0])[:, None]).any(dim=1)
        metrics[f"i2t_r{k}"] = 100.0 * hits.float().mean().item()
        top_images = sims.topk(k, dim=0).indices  # (k, N_c)
        metrics[f"t2i_r{k}"] = 100.0 * (top_images == owner[None]).any(dim=0).float().mean().item()
    metrics["rsum"] = sum(metrics.values())
    return metrics


def test_zero_shot_retrieval_is_open_clips_own(tmp_path, weights, capsys):
    config = _config(tmp_path / "zs", weights, "zero_shot")
    result = train(config)  # trains nothing: its epoch is its evaluation
    test = Trainer(config).splits["test"]
    expected = _clip_similarities(weights, test)  # (10, 50)
    # the captions' scores differ from image to image by far more than the tolerance
    assert expected.std(dim=0).min() > 100 * 1e-4
    encoded = encode_checkpoint(config, result.checkpoint, device="cpu")
    torch.testing.assert_close(encoded.head.score_block(encoded.image_feats, encoded.text_feats)[0],
                               expected, rtol=1e-5, atol=1e-4)
    recalls = _recalls(expected, test.caption_to_image)
    evaluated = evaluate_checkpoint(config, result.checkpoint, device="cpu")
    for key, value in recalls.items():
        assert result.final_metrics[f"test/{key}"] == pytest.approx(value, abs=1e-4), key
        assert evaluated[key] == pytest.approx(value, abs=1e-4), key
    # no sigma_hat: no uncertainty analysis, and `vacsr eval` names no plot it did not write
    assert not [key for key in evaluated if "sigma" in key or "uncertainty" in key]
    capsys.readouterr()
    out = tmp_path / "eval.json"
    assert main(["eval", "--checkpoint", str(result.checkpoint), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out}"
    assert not out.with_suffix(".uncertainty.png").exists()
    state = load_checkpoint(result.checkpoint)
    assert state["optimizer"] == {}  # nothing trains
    # noisy training pairs are never read: the same evaluation
    noisy = train(_config(tmp_path / "noisy", weights, "zero_shot", "data.noise_ratio=0.4"))
    assert {k: v for k, v in noisy.final_metrics.items() if not k.endswith("eval_seconds")} == {
        k: v for k, v in result.final_metrics.items() if not k.endswith("eval_seconds")}


# ---------------------------------------------------------------- CLIP's contrastive loss


def _hand_infonce(logits: list[list[float]], labels: list[list[float]]) -> tuple[float, float]:
    """(L_i2t, L_t2i) with plain floats: per row (column) the cross-entropy of the log-softmax
    against the row's (column's) positives, each weighted 1 / their count."""
    def direction(rows, targets) -> float:
        total = 0.0
        for row, target in zip(rows, targets):
            log_norm = math.log(sum(math.exp(value) for value in row))
            positives = sum(target)
            total -= sum(t / positives * (value - log_norm) for value, t in zip(row, target))
        return total / len(rows)

    transpose = lambda m: [list(column) for column in zip(*m)]  # noqa: E731
    return direction(logits, labels), direction(transpose(logits), transpose(labels))


def test_the_infonce_loss_is_clips_with_soft_targets(tmp_path):
    generator = torch.Generator().manual_seed(3)
    image = torch.randn(4, 8, generator=generator, dtype=torch.float64)  # (B, d)
    text = torch.randn(4, 8, generator=generator, dtype=torch.float64)  # (B', d)
    head = ContrastiveHead(logit_scale=math.log(10.0)).double()
    # a retrieval batch that drew two captions of image 1: rows and columns 1, 2 hold two
    keys = torch.tensor([0, 1, 1, 2])
    labels = (keys[:, None] == keys[None, :]).double()  # (4, 4)
    loss, parts = contrastive_loss(head, image, text, labels)
    scale = math.exp(head.logit_scale.item())  # 10, as the float32 parameter holds it
    logits = scale * F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).T
    i2t, t2i = _hand_infonce(logits.tolist(), labels.tolist())
    assert abs(i2t - t2i) > 1e-3  # the two directions differ here: each is checked
    assert parts["infonce_i2t"].item() == pytest.approx(i2t, rel=1e-9)
    assert parts["infonce_t2i"].item() == pytest.approx(t2i, rel=1e-9)
    assert loss.item() == pytest.approx((i2t + t2i) / 2, rel=1e-9)
    assert parts["logit_scale"].item() == pytest.approx(math.log(10.0), rel=1e-6)
    # one positive per row and column: CLIP's Fig. 3 (labels = arange(n), both axes)
    loss, _ = contrastive_loss(head, image, text, torch.eye(4, dtype=torch.float64))
    arange = torch.arange(4)
    clip = (F.cross_entropy(logits, arange) + F.cross_entropy(logits.T, arange)) / 2
    assert loss.item() == pytest.approx(clip.item(), rel=1e-9)


def test_the_temperature_is_trained_and_clipped_at_log_100():
    assert ContrastiveHead(logit_scale=math.log(300.0)).logit_scale.item() == pytest.approx(
        MAX_LOGIT_SCALE)  # a backbone's larger value starts at the bound
    head = ContrastiveHead(logit_scale=math.log(10.0))
    generator = torch.Generator().manual_seed(0)
    image = F.normalize(torch.randn(6, 8, generator=generator), dim=-1)  # (B, d)
    text = image + 0.1 * torch.randn(6, 8, generator=generator)  # each row's own caption closest
    optimizer = torch.optim.SGD(head.parameters(), lr=1.0)
    loss, _ = contrastive_loss(head, image, text, torch.eye(6))
    loss.backward()
    assert head.logit_scale.grad < 0  # a sharper softmax lowers this loss: t goes up
    optimizer.step()
    assert head.logit_scale.item() > math.log(10.0)
    # a step past the bound: the next use clips it, and scores with at most 100
    with torch.no_grad():
        head.logit_scale.fill_(MAX_LOGIT_SCALE + 1.0)
    logits = head(image, text).logits
    assert head.logit_scale.item() == pytest.approx(MAX_LOGIT_SCALE)
    torch.testing.assert_close(logits, 100.0 * image @ F.normalize(text, dim=-1).T)
    head.zero_grad()
    contrastive_loss(head, image, text, torch.eye(6))[0].backward()
    assert head.logit_scale.grad != 0  # at the bound it still trains, as CLIP's clip keeps it


def test_clip_contrastive_trains_its_temperature_and_the_searched_blocks(tmp_path, weights):
    config = _config(tmp_path / "cc", weights, "clip_contrastive", "model.use_gpo=false",
                     "model.trainable_image_blocks=1", "model.trainable_text_blocks=0",
                     "model.trainable_side=last", "model.train_projections=false",
                     "data.noise_ratio=0.4")
    trainer = Trainer(config)
    clip_scale = trainer.model.backbone.clip.logit_scale.item()
    assert trainer.model.head.logit_scale.item() == pytest.approx(clip_scale)  # CLIP's value
    trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert "head.logit_scale" in trainable
    assert {n.split(".")[0] for n in trainable} == {"head", "backbone"}
    assert not [n for n in trainable if n.startswith("backbone.clip.transformer.")]  # no text
    initial = {name: p.detach().clone() for name, p in trainer.model.named_parameters()
               if name in trainable}
    result = trainer.fit()
    final = load_checkpoint(result.checkpoint)["model"]
    for name, value in initial.items():
        assert not torch.equal(final[name], value), f"{name} did not train"
    history = trainer.history[-1]
    assert history["train/loss"] == pytest.approx(
        (history["train/infonce_i2t"] + history["train/infonce_t2i"]) / 2, rel=1e-5)
    assert history["train/logit_scale"] <= MAX_LOGIT_SCALE and result.final_metrics["test/rsum"] > 0


def test_clip_contrastive_refuses_classification_in_one_line(tmp_path, weights, capsys):
    out = tmp_path / "run"
    assert main(["train", *_overrides(out, weights, "clip_contrastive"),
                 "data.task=classification", "data.dataset=eurosat",
                 f"data.root={tmp_path}"]) == 2
    assert capsys.readouterr().err.strip() == (
        "vacsr: error: adapter.kind: clip_contrastive supports data.task retrieval, not "
        "'classification'")
    assert not out.exists()
