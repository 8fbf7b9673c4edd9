"""Methods as plug-ins (vacsr/methods/): zero-shot CLIP is CLIP's own accuracy, every compared
method starts at it (the linear probe before its first step, CLIP-Adapter at residual ratio 0,
CoOp from "a photo of a"), the trained ones move their head alone and their checkpoints evaluate
as their runs did, the linear probe scores novel classes zero-shot, bad input is one line, and
the registry holds every method module with a space and a protocol made of config values.

The tiny CLIP has random weights (one file, so every method's backbone is the same) and the data
is EuroSAT's layout with synthetic images (5 base and 5 novel classes)."""
from __future__ import annotations

import importlib
import json
import math
import pkgutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import vacsr.methods
from vacsr.cli import main
from vacsr.config import Config, flatten, load_config, set_value, validate
from vacsr.data.base import load_image
from vacsr.errors import ConfigError
from vacsr.methods.registry import METHODS
from vacsr.model.backbone import create_clip
from vacsr.model.clip_heads import CosineHead, PrototypeHead, prototypes_for, trained_rows
from vacsr.sweep.spec.space import bounding_values, validate_space
from vacsr.train.checkpoint import load_checkpoint
from vacsr.train.eval_pass import (
    encode_checkpoint,
    encode_split,
    encode_views,
    evaluate_checkpoint,
)
from vacsr.train.loop import Trainer, train

pytestmark = pytest.mark.timeout(300)

# the trained runs: a method and the overrides that pick its variant
TRAINED = {"linear_probe": ("linear_probe",), "clip_adapter": ("clip_adapter",),
           "coop": ("coop", "adapter.context_init=a photo of a"),
           "coop_random": ("coop", "adapter.context_init=random", "adapter.context_tokens=4"),
           "mma": ("mma", "adapter.mma_blocks=2", "adapter.mma_scale=0.1"),
           "cocoop": ("cocoop", "adapter.context_init=a photo of a"),
           "maple": ("maple", "adapter.context_init=random", "adapter.context_tokens=2")}


@pytest.fixture(scope="module")
def eurosat(tmp_path_factory) -> Path:
    from vacsr.data.generate import generate_all

    # per class: 4 training images (2 shots drawn), 3 val, 4 test
    return generate_all(tmp_path_factory.mktemp("data"), datasets=["eurosat"], per_class=(4, 3, 4))


def _protocol(kind: str) -> list[str]:
    """The config values the method fixes, as overrides (a sweep applies them the same way)."""
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}"
            for key, value in METHODS[kind].protocol.items()]


def _overrides(out: Path, weights: Path, root: Path, kind: str, *extra: str) -> list[str]:
    return [f"model.pretrained={weights}", f"train.output_dir={out}", "train.resume=false",
            "train.progress=false", "train.device=cpu", "data.task=classification",
            "data.dataset=eurosat", f"data.root={root}", "data.shots=2", "data.augment=false",
            "train.batch_size=4", "train.epochs=1", "optim.lr=0.05", "optim.schedule=constant",
            f"adapter.kind={kind}", *_protocol(kind), *extra]


def _config(out: Path, weights: Path, root: Path, kind: str, *extra: str):
    return load_config(overrides=_overrides(out, weights, root, kind, *extra))


def _logits(model, data) -> torch.Tensor:
    """(N, C) class logits of a split through vacsr's evaluation encoding and the model's head."""
    encoded = encode_split(model, data, task="classification")
    return model.head.score_block(encoded.image_feats, encoded.text_feats)[0]


def _encoded_logits(encoded) -> torch.Tensor:
    return encoded.head.score_block(encoded.image_feats, encoded.text_feats)[0]


def _accuracy(logits: torch.Tensor, labels) -> float:
    correct = int((logits.argmax(dim=1) == torch.as_tensor(labels)).sum())
    return 100.0 * correct / len(labels)


@torch.no_grad()
def _clip_logits(weights: Path, data) -> torch.Tensor:
    """open_clip's own zero-shot classifier on a split: its eval transform, encode_image /
    encode_text (normalised) and exp(t) cos, with the dataset's template."""
    clip, _, eval_transform, tokenizer = create_clip("vacsr-tiny", str(weights))
    clip.eval()
    images = torch.stack([eval_transform(load_image(ref)) for ref in data.images])
    prompts = [data.template.format(name.replace("_", " ")) for name in data.classnames]
    image = clip.encode_image(images, normalize=True)  # (N, d)
    text = clip.encode_text(tokenizer(prompts), normalize=True)  # (C, d)
    return clip.logit_scale.exp() * image @ text.T


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, weights, eurosat):
    """label -> (config, the model's state before training, the run's TrainResult); each run
    trains once per module (`vacsr.train.loop.train`, 1 epoch of 3 steps)."""
    done = {}

    def run(label: str):
        if label not in done:
            kind, *extra = TRAINED[label]
            config = _config(tmp_path_factory.mktemp(label), weights, eurosat, kind, *extra)
            # the Trainer seeds before building the model: the state the run starts from
            initial = Trainer(config)
            trainable = {name for name, p in initial.model.named_parameters() if p.requires_grad}
            state = {key: value.clone() for key, value in initial.model.state_dict().items()}
            done[label] = (config, state, trainable, train(config))
        return done[label]

    return run


# ---------------------------------------------------------------- zero-shot CLIP


def test_zero_shot_accuracy_is_open_clips_own(tmp_path, weights, eurosat):
    config = _config(tmp_path / "zs", weights, eurosat, "zero_shot")
    result = train(config)  # trains nothing: its epoch is its evaluation
    test = Trainer(config).splits["test"]
    expected = _clip_logits(weights, test)  # (20, 5)
    # random weights predict one class for most images, so the logits are compared too: they
    # differ from image to image by far more than the tolerance
    assert expected.std(dim=0).min() > 100 * 1e-4
    accuracy = _accuracy(expected, test.labels)
    assert result.final_metrics["test/acc"] == pytest.approx(accuracy, rel=1e-6)
    assert evaluate_checkpoint(config, result.checkpoint, device="cpu")["acc"] == pytest.approx(
        accuracy, rel=1e-6)
    encoded = encode_checkpoint(config, result.checkpoint, device="cpu")
    torch.testing.assert_close(_encoded_logits(encoded), expected, rtol=1e-5, atol=1e-4)
    state = load_checkpoint(result.checkpoint)
    assert state["optimizer"] == {}  # no optimizer: nothing trains
    clip = torch.load(weights, weights_only=True)
    assert all(torch.equal(state["model"][f"backbone.clip.{key}"], value)
               for key, value in clip.items())


# ---------------------------------------------------------------- identity points


def test_each_compared_method_starts_at_zero_shot_clip(tmp_path, weights, eurosat):
    zero = Trainer(_config(tmp_path / "zs", weights, eurosat, "zero_shot"))
    test = zero.splits["test"]
    reference = _logits(zero.model, test)  # (20, 5)
    reference_acc = zero.evaluate("test")["acc"]

    # the linear probe before its first step: w_c = t_c + 0
    probe = Trainer(_config(tmp_path / "lp", weights, eurosat, "linear_probe"))
    delta = probe.model.head.delta
    assert delta.shape == (len(probe.splits["train"].classnames), 64) and not delta.any()
    torch.testing.assert_close(_logits(probe.model, test), reference, rtol=0, atol=1e-6)
    assert probe.evaluate("test")["acc"] == reference_acc

    # CLIP-Adapter at alpha = 0: its random bottleneck acts, and the ratio takes it out
    adapter = Trainer(_config(tmp_path / "ca", weights, eurosat, "clip_adapter",
                              "adapter.residual_ratio=0"))
    assert adapter.model.head.adapter(torch.randn(8, 64)).abs().sum() > 0
    torch.testing.assert_close(_logits(adapter.model, test), reference, rtol=0, atol=1e-6)
    assert adapter.evaluate("test")["acc"] == reference_acc
    blended = Trainer(_config(tmp_path / "cb", weights, eurosat, "clip_adapter",
                              "adapter.residual_ratio=0.5"))
    assert not torch.allclose(_logits(blended.model, test), reference, atol=1e-3)

    # MMA at alpha = 0: its adapters act inside both towers, and the scale takes them out
    mma = Trainer(_config(tmp_path / "mm", weights, eurosat, "mma", "adapter.mma_scale=0",
                          "adapter.mma_blocks=2"))
    assert set(mma.model.backbone.hooks) == {"image", "text"}
    assert mma.model.backbone.frozen_depth("image") == 1  # blocks 1 and 2 of 3 adapted
    torch.testing.assert_close(_logits(mma.model, test), reference, rtol=0, atol=1e-5)
    assert mma.evaluate("test")["acc"] == reference_acc
    scaled = Trainer(_config(tmp_path / "ms", weights, eurosat, "mma", "adapter.mma_scale=0.5",
                             "adapter.mma_blocks=2"))
    assert not torch.allclose(_logits(scaled.model, test), reference, atol=1e-3)

    # CoOp from "a photo of a" is zero-shot CLIP with the template "a photo of a {}."
    coop = Trainer(_config(tmp_path / "co", weights, eurosat, "coop",
                           "adapter.context_init=a photo of a"))
    photo = replace(test, template="a photo of a {}.")
    photo_logits = _logits(zero.model, photo)
    assert not torch.allclose(photo_logits, reference, atol=1e-3)  # the template matters here
    torch.testing.assert_close(_logits(coop.model, test), photo_logits, rtol=0, atol=1e-5)
    assert coop.evaluate("test")["acc"] == pytest.approx(_accuracy(photo_logits, test.labels),
                                                         rel=1e-6)
    # the training path's class features (through the context, with autograd) are the same
    features = coop.task.class_features(torch.device("cpu"))  # (5, d)
    assert features.requires_grad
    torch.testing.assert_close(features.detach(), encode_split(zero.model, photo,
                                                               task="classification").text_feats,
                               rtol=0, atol=1e-6)


def test_cocoop_with_a_silent_meta_net_is_coop_with_the_same_context(tmp_path, weights,
                                                                    eurosat):
    """pi = 0: every image's prompts are CoOp's, in evaluation and in the training pass; with the
    meta-net speaking, the class features differ from image to image."""
    coop = Trainer(_config(tmp_path / "co", weights, eurosat, "coop"))
    cocoop = Trainer(_config(tmp_path / "cc", weights, eurosat, "cocoop"))
    test = coop.splits["test"]
    with torch.no_grad():
        cocoop.model.head.context.copy_(torch.randn_like(cocoop.model.head.context))
        coop.model.head.context.copy_(cocoop.model.head.context)  # a trained-looking context
    talking = _encoded_logits(encode_split(cocoop.model, test, task="classification"))
    last = cocoop.model.head.meta_net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
    reference = _logits(coop.model, test)  # (20, 5)
    silent = encode_split(cocoop.model, test, task="classification")
    assert silent.image_feats.shape == (20, 5)  # each image's class logits, scored as they are
    torch.testing.assert_close(_encoded_logits(silent), reference, rtol=0, atol=1e-5)
    assert cocoop.evaluate("test")["acc"] == coop.evaluate("test")["acc"]
    assert not torch.allclose(talking, reference, atol=1e-3)  # the meta-net's token matters

    images = cocoop.task.train_dataset(cocoop.splits["train"],
                                       cocoop.model.backbone.eval_transform)
    batch = next(iter(cocoop.train_loader(0, dataset=images)))  # (images, labels)
    cocoop.task.image_features_given = coop.task.image_features_given = False
    pairs, shared = cocoop.task.features(batch), coop.task.features(batch)
    assert pairs.text_per_image and pairs.text_feats.shape == (len(batch[1]), 5, 64)
    assert pairs.text_feats.requires_grad  # the context and the meta-net learn through them
    for per_image in pairs.text_feats.detach():
        torch.testing.assert_close(per_image, shared.text_feats.detach(), rtol=0, atol=1e-6)
    loss, _ = cocoop.task.loss_from_pairs(pairs)
    torch.testing.assert_close(loss, coop.task.loss_from_pairs(shared)[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["coop", "cocoop", "maple"])
def test_prompts_cut_at_the_longest_ones_end_give_the_whole_contexts_features_and_gradients(
        kind, tmp_path, weights, eurosat, monkeypatch):
    """A prompt method's text tower runs only up to its longest prompt's EOT (prefix.prompt_end):
    under CLIP's causal mask the features, and every gradient reaching the learned prompts (the
    context, CoCoOp's meta-net, MaPLe's deeper prompts), equal those over the whole context."""
    from vacsr.methods.method import class_prompts
    from vacsr.model import prefix

    trainer = Trainer(_config(tmp_path / kind, weights, eurosat, kind))
    model, backbone = trainer.model, trainer.model.backbone
    tokens = backbone.tokenize(class_prompts(model, trainer.splits["train"]))  # (C, T)
    end = prefix.prompt_end(backbone.clip, tokens)
    assert int(tokens.argmax(dim=-1).max()) + 1 == end < tokens.shape[1]  # the cut applies
    images = F.normalize(torch.randn(3, 64, generator=torch.Generator().manual_seed(0)), dim=-1)

    def features_and_grads():
        model.zero_grad()
        if kind == "cocoop":
            features = model.head.encode_conditioned(backbone, tokens, images)  # (3, C, D)
        else:
            features = model.head.encode_prompts(backbone, tokens)  # (C, D)
        weights_ = torch.linspace(-1, 1, features.numel()).reshape(features.shape)
        (features * weights_).sum().backward()
        grads = {name: p.grad.clone() for name, p in model.head.named_parameters()
                 if p.grad is not None}
        return features.detach(), grads

    cut, cut_grads = features_and_grads()
    monkeypatch.setattr(prefix, "prompt_end", lambda clip, ids: ids.shape[1])  # all T
    whole, whole_grads = features_and_grads()
    torch.testing.assert_close(cut, whole, rtol=0, atol=1e-6)
    assert "context" in cut_grads and sorted(cut_grads) == sorted(whole_grads)
    for name, grad in cut_grads.items():
        scale = float(whole_grads[name].abs().max())  # float sums in another order
        torch.testing.assert_close(grad, whole_grads[name], rtol=0, atol=1e-4 * scale)


def test_maple_reduced_to_its_first_language_prompts_is_coop_with_that_context(
        tmp_path, weights, eurosat):
    """J = 1 without vision prompts: CoOp exactly; the prompts of the deeper blocks and the
    vision prompts each move the logits."""
    from vacsr.methods.build import build_model
    from vacsr.model.maple import MultiModalPromptHead

    coop = Trainer(_config(tmp_path / "co", weights, eurosat, "coop",
                           "adapter.context_init=random", "adapter.context_tokens=2"))
    test = coop.splits["test"]
    reference = _logits(coop.model, test)
    config = _config(tmp_path / "mp", weights, eurosat, "maple", "adapter.context_init=random",
                     "adapter.context_tokens=2")

    def maple(depth: int, couple: bool):
        model = build_model(config)
        head = model.head
        reduced = MultiModalPromptHead(
            logit_scale=float(head.logit_scale), context=coop.model.head.context,
            words=head.words, depth=depth, image_width=64,
            ln_pre=model.backbone.clip.visual.ln_pre, couple=couple)
        model.backbone.load_state_dict(coop.model.backbone.state_dict())
        model.head = reduced
        model.backbone.attach_hooks(reduced.tower_hooks())
        return model.eval()

    first = maple(1, couple=False)
    assert first.backbone.hooks == {}
    torch.testing.assert_close(_logits(first, test), reference, rtol=0, atol=1e-5)
    deep = maple(3, couple=False)
    assert set(deep.backbone.hooks) == {"text"}
    assert not torch.allclose(_logits(deep, test), reference, atol=1e-3)
    coupled = maple(1, couple=True)
    assert set(coupled.backbone.hooks) == {"image"}
    assert coupled.backbone.frozen_depth("image") == 0  # prompts enter at block 0
    assert not torch.allclose(_logits(coupled, test), reference, atol=1e-3)
    # the method as configured: the paper's share of 3 blocks is J = 2, in both towers
    built = build_model(config)
    assert built.head.depth == 2 and len(built.head.couplings) == 2
    assert {tower: sorted(h.before) for tower, h in built.backbone.hooks.items()} == {
        "image": [0, 1], "text": [1]}


# ---------------------------------------------------------------- trained methods


@pytest.mark.parametrize("label", list(TRAINED))
def test_a_trained_method_moves_its_head_alone_and_its_checkpoint_evaluates_as_its_run(
        label, trained_run, tmp_path):
    config, initial, trainable, result = trained_run(label)
    final = load_checkpoint(result.checkpoint)["model"]
    assert final.keys() == initial.keys()
    # what trains is the head's parameters (logit_scale is a buffer): the backbone is frozen
    assert trainable and all(name.startswith("head.") for name in trainable)
    for key in final:
        if key in trainable:
            assert not torch.equal(final[key], initial[key]), f"{key} did not train"
        else:
            assert torch.equal(final[key], initial[key]), f"{key} changed"
    out = tmp_path / "eval.json"
    assert main(["eval", "--checkpoint", str(result.checkpoint), "--out", str(out)]) == 0
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["acc"] == result.final_metrics["test/acc"]
    assert metrics["num_samples"] == 20


def test_the_linear_probe_scores_novel_classes_with_their_zero_shot_prototypes(
        trained_run, tmp_path, weights, eurosat):
    config, _, _, result = trained_run("linear_probe")
    zero_config = _config(tmp_path / "zs", weights, eurosat, "zero_shot")
    zero = train(zero_config)

    probe_novel = encode_checkpoint(config, result.checkpoint, subsample="novel", device="cpu")
    zero_novel = encode_checkpoint(zero_config, zero.checkpoint, subsample="novel",
                                   device="cpu")
    assert probe_novel.text_feats.shape[0] == 5  # the novel classes, no trained weight
    torch.testing.assert_close(_encoded_logits(probe_novel), _encoded_logits(zero_novel),
                               rtol=0, atol=1e-6)
    zero_metrics = evaluate_checkpoint(zero_config, zero.checkpoint, subsample="novel",
                                       device="cpu")
    assert evaluate_checkpoint(config, result.checkpoint, subsample="novel",
                               device="cpu") == zero_metrics
    # `vacsr eval` names the evaluated classes with an override of the stored config: the
    # checkpoint's own config still says which classes it trained on
    out = tmp_path / "novel.json"
    assert main(["eval", "--checkpoint", str(result.checkpoint), "--out", str(out),
                 "data.subsample_classes=novel"]) == 0
    assert json.loads(out.read_text())["metrics"] == zero_metrics

    # the base classes: its trained prototypes t_c + delta_c
    base = encode_checkpoint(config, result.checkpoint, device="cpu")
    delta = load_checkpoint(result.checkpoint)["model"]["head.delta"]  # (5, d)
    expected = base.head.logit_scale.exp() * (F.normalize(base.image_feats, dim=-1)
                                              @ F.normalize(base.text_feats + delta, dim=-1).T)
    torch.testing.assert_close(_encoded_logits(base), expected, rtol=1e-5, atol=1e-4)
    zero_base = encode_checkpoint(zero_config, zero.checkpoint, device="cpu")
    assert not torch.allclose(_encoded_logits(base), _encoded_logits(zero_base), atol=1e-2)

    # every class at once (another class set than the trained one): the base classes by name
    # keep their trained prototypes, the novel ones are zero-shot
    both = _encoded_logits(encode_checkpoint(config, result.checkpoint, subsample="all",
                                             device="cpu"))  # (20 + 20 images, 10)
    base_images, novel_images = base.image_feats.shape[0], probe_novel.image_feats.shape[0]
    assert both.shape == (base_images + novel_images, 10)
    torch.testing.assert_close(both[:base_images, :5], _encoded_logits(base), rtol=0, atol=1e-5)
    torch.testing.assert_close(both[base_images:, 5:], _encoded_logits(zero_novel), rtol=0,
                               atol=1e-5)
    # the three in one load of the checkpoint (a sweep's final evaluation): each view its head
    views = encode_views(config, result.checkpoint, ((None, None), (None, "novel"), (None, "all")),
                         device="cpu")
    for view, alone in zip(views, (_encoded_logits(base), _encoded_logits(probe_novel), both)):
        torch.testing.assert_close(_encoded_logits(view), alone, rtol=0, atol=0)


def _probe(names: list[str], dim: int = 8) -> PrototypeHead:
    head = PrototypeHead(logit_scale=math.log(100.0), embed_dim=dim)
    head.fit_classes(names)
    with torch.no_grad():
        head.delta.copy_(torch.randn(len(names), dim, generator=torch.Generator().manual_seed(3)))
    return head


def test_the_linear_probe_scores_a_class_set_by_name():
    """ImageNet's classes on a shifted test set (ImageNet-A/R: a subset, in another order): each
    class it trained on keeps its own prototype, by name; a name it never trained on is scored
    zero-shot; a checkpoint without the names scores them all zero-shot, as before."""
    names = [f"class {i}" for i in range(10)]
    head = _probe(names)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(6, 8, generator=generator)  # (N, d)
    prompts = torch.randn(10, 8, generator=generator)  # (C, d): t_c of each trained class
    own = head.score_block(images, prompts)[0]  # (6, 10)

    # a checkpoint's state carries the names (as a tensor): a fresh head loads them
    loaded = PrototypeHead(logit_scale=math.log(100.0), embed_dim=8)
    loaded.load_state_dict(head.state_dict())
    assert loaded.trained_names() == names

    order = [7, 2, 9, 4]  # a permuted subset
    subset = prototypes_for(loaded, [names[i] for i in order])
    torch.testing.assert_close(subset.score_block(images, prompts[order])[0], own[:, order],
                               rtol=1e-6, atol=1e-5)
    # the same classes with two it never trained on between them
    unknown = torch.randn(2, 8, generator=generator)
    mixed = prototypes_for(loaded, [names[7], "unseen a", names[2], "unseen b"])
    scores = mixed.score_block(images, torch.cat([prompts[7:8], unknown[:1], prompts[2:3],
                                                  unknown[1:]]))[0]  # (6, 4)
    zero_shot = CosineHead(logit_scale=math.log(100.0))
    torch.testing.assert_close(scores[:, [0, 2]], own[:, [7, 2]], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(scores[:, [1, 3]], zero_shot.score_block(images, unknown)[0],
                               rtol=1e-6, atol=1e-5)
    # no name in common (base-to-novel's novel classes): the zero-shot head itself
    assert type(prototypes_for(loaded, ["unseen a", "unseen b"])) is CosineHead

    # a checkpoint from before the names were kept: it loads, and knows no class
    old = {k: v for k, v in head.state_dict().items() if k != "class_names"}
    before = PrototypeHead(logit_scale=math.log(100.0), embed_dim=8)
    before.load_state_dict(old)
    assert before.trained_names() is None and torch.equal(before.delta, head.delta)
    assert type(prototypes_for(before, [names[i] for i in order])) is CosineHead


def test_a_name_several_trained_classes_share_matches_only_when_unambiguous():
    trained = ["crane", "kite", "crane", "maillot"]
    assert trained_rows(trained, ["crane", "maillot", "crane"]) == [0, 3, 2]
    # one "crane" of the two: which one is unknown, so it is scored zero-shot
    assert trained_rows(trained, ["kite", "crane"]) == [1, -1]
    assert trained_rows(trained, ["new"]) == [-1]


# ---------------------------------------------------------------- bad input


def _refused(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


def test_an_unknown_method_is_one_line_naming_the_methods(tmp_path, weights, eurosat, capsys):
    out = tmp_path / "run"
    argv = ["train", *_overrides(out, weights, eurosat, "zero_shot"), "adapter.kind=nope"]
    assert _refused(argv, capsys) == (
        "vacsr: error: adapter.kind: unknown method 'nope'; the methods are vacsr, "
        "sigmoid_baseline, zero_shot, linear_probe, clip_adapter, coop, cocoop, mma, maple, "
        "clip_contrastive")
    assert not out.exists()


def test_a_plain_train_of_a_method_takes_its_fixed_values_and_refuses_one_against_them(
        tmp_path, weights, eurosat, capsys):
    """`vacsr train adapter.kind=coop` with none of CoOp's fixed values typed: the run takes them
    (a frozen CLIP, unaugmented) as a sweep's unit does, says so once, and its saved config holds
    them; a value given against them is refused in one line before anything is written."""
    from vacsr.config.yaml_reader import read_yaml_file
    from vacsr.train.run_files import CONFIG_FILE

    fixed = METHODS["coop"].protocol
    plain = [o for o in _overrides(tmp_path / "run", weights, eurosat, "coop",
                                   "adapter.context_init=a photo of a")
             if o.split("=")[0] not in fixed]
    assert main(["train", *plain]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if " fixes " in line]
    assert len(notes) == 1 and notes[0].startswith("adapter.kind=coop fixes "), notes
    assert all(f"{key}={str(value).lower()}" in notes[0] for key, value in fixed.items()), notes
    saved = flatten(load_config(tmp_path / "run" / CONFIG_FILE))
    assert {key: saved[key] for key in fixed} == dict(fixed)
    assert read_yaml_file(tmp_path / "run" / CONFIG_FILE, "")["adapter"]["kind"] == "coop"

    out = tmp_path / "against"
    against = [o.replace(str(tmp_path / "run"), str(out)) for o in plain]
    assert _refused(["train", *against, "model.trainable_text_blocks=2"], capsys) == (
        "vacsr: error: adapter.kind: coop runs with model.trainable_text_blocks=0 "
        f"({METHODS['coop'].trains}); this config has model.trainable_text_blocks=2; set those "
        "values")
    assert not out.exists()


def test_mma_adapts_the_papers_share_of_each_tower_or_as_many_as_asked_never_fewer(
        tmp_path, weights, eurosat, capsys):
    """-1 is the paper's share (blocks 5-11 of ViT-B/16's 12: 7 of every 12); N is the highest
    N; more than the towers have is one line, from `vacsr train` before any run folder and from
    a sweep's plan before Ray, not fewer adapters than asked for."""
    from conftest import sweep_plan
    from sweeps.base2novel import SWEEP as BASE2NOVEL
    from vacsr.methods.mma import adapted_blocks

    assert adapted_blocks(-1, 12) == tuple(range(5, 12)) and adapted_blocks(-1, 3) == (1, 2)
    assert adapted_blocks(3, 3) == (0, 1, 2) and adapted_blocks(-1, 1) == (0,)
    refusal = ("adapter.mma_blocks: 4 exceeds the 3 blocks of vacsr-tiny's towers; expected at "
               "most 3, or -1 (the paper's share)")
    out = tmp_path / "run"
    argv = ["train", *_overrides(out, weights, eurosat, "mma"), "adapter.mma_blocks=4"]
    assert _refused(argv, capsys) == f"vacsr: error: {refusal}"
    assert not out.exists()
    with pytest.raises(ConfigError) as info:
        sweep_plan(BASE2NOVEL, tmp_path / "store", ["--datasets", "eurosat", "--methods",
                                                    "vacsr,mma", "--set", "adapter.mma_blocks=4"],
                   data=tmp_path / "layouts")
    assert str(info.value) == refusal


@pytest.mark.parametrize("kind", [name for name, method in METHODS.items()
                                  if "retrieval" not in method.tasks])
def test_a_classification_method_refuses_retrieval_in_one_line(kind, tmp_path, weights, capsys):
    out = tmp_path / "run"
    argv = ["train", f"model.pretrained={weights}", f"train.output_dir={out}",
            "train.progress=false", "data.num_train=8", "data.num_test=10",
            "train.batch_size=4", f"adapter.kind={kind}", *_protocol(kind)]
    assert _refused(argv, capsys) == (
        f"vacsr: error: adapter.kind: {kind} supports data.task classification, not "
        "'retrieval'")
    assert not out.exists()


def test_a_classification_checkpoint_refuses_retrieval_evaluation(trained_run):
    config, _, _, result = trained_run("linear_probe")
    retrieval = replace(config, data=replace(config.data, task="retrieval", dataset="synthetic",
                                             root=None))
    with pytest.raises(ConfigError, match=r"^adapter.kind: linear_probe supports data.task "
                                          r"classification, not 'retrieval'$"):
        evaluate_checkpoint(retrieval, result.checkpoint, device="cpu")


def test_coop_context_that_leaves_no_room_for_a_class_name_is_one_line(tmp_path, weights,
                                                                       eurosat, capsys):
    out = tmp_path / "run"
    base = ["train", *_overrides(out, weights, eurosat, "coop")]
    # 16 text positions: <SOT>, 13 context tokens, a word of the name and <EOT> fit; 14 do not
    assert _refused([*base, "adapter.context_init=random", "adapter.context_tokens=14"],
                    capsys) == (
        "vacsr: error: adapter.context_tokens: 14 context tokens leave no room for a class name "
        "in vacsr-tiny's 16 text positions; expected at most 13")
    assert not out.exists()  # refused before the run folder holds anything
    err = _refused([*base, "adapter.context_init=a b c d e f g h i j k l m n"], capsys)
    assert err.startswith("vacsr: error: adapter.context_init: 'a b c d e f g h i j k l m n' is "
                          "14 tokens"), err
    assert not out.exists()
    # a phrase longer than the positions is counted whole, as a sweep's plan counts it
    err = _refused([*base, "adapter.context_init=a b c d e f g h i j k l m n o p q r s t"], capsys)
    assert "'a b c d e f g h i j k l m n o p q r s t' is 20 tokens, which leave no room" in err, err
    assert not out.exists()
    fits = Trainer(_config(out, weights, eurosat, "coop", "adapter.context_init=random",
                           "adapter.context_tokens=13"))
    assert fits.model.head.context.shape == (13, 64)


# ---------------------------------------------------------------- the registry


def test_every_method_module_is_registered():
    modules = [importlib.import_module(f"vacsr.methods.{info.name}")
               for info in pkgutil.iter_modules(vacsr.methods.__path__)]
    declared = [module.METHOD for module in modules if hasattr(module, "METHOD")]
    assert sorted(method.name for method in declared) == sorted(METHODS)
    assert all(METHODS[method.name] is method for method in declared)
    assert set(METHODS) == {"vacsr", "sigmoid_baseline", "zero_shot", "linear_probe",
                            "clip_adapter", "coop", "cocoop", "mma", "maple", "clip_contrastive"}


def test_what_a_head_needs_from_a_run_is_declared_on_its_method():
    """The trainer and the evaluation ask the method, never the head: a head with a weight per
    class must say so (else its classes are never fitted and it scores nothing), one that
    encodes its prompts too (else its learned context never reaches a class feature). And the
    config's default method is the paper's, registered."""
    from vacsr.config import DEFAULT_METHOD
    from vacsr.model.backbone import build_backbone

    backbone = build_backbone(Config().model)
    for name, method in METHODS.items():
        config = Config()
        set_value(config, "adapter.kind", name)
        head = method.build_head(config.adapter, backbone)
        assert hasattr(head, "fit_classes") == method.class_weights, name
        assert hasattr(head, "encode_prompts") == method.encodes_prompts, name
        assert not method.learned_context or method.encodes_prompts, name
        assert hasattr(head, "tower_hooks") == (method.hooked_blocks is not None), name
    assert DEFAULT_METHOD == Config().adapter.kind and DEFAULT_METHOD in METHODS
    assert "VACSR" in METHODS[DEFAULT_METHOD].cites


@pytest.mark.parametrize("name", list(METHODS))
def test_a_methods_space_and_protocol_are_config_values(name):
    method = METHODS[name]
    keys = set(flatten(Config()))
    space = method.searched({})
    validate_space(space)  # real keys, non-empty domains
    assert set(method.own_keys) <= keys and set(method.kind_keys or ()) <= keys
    assert not set(method.protocol) & set(space)  # a fixed key is never searched
    if method.loss is None:  # nothing trains, so nothing is searched
        assert space == {}
    for key, domain in space.items():  # every value a trial can be given
        for value in bounding_values(domain):
            config = Config()
            set_value(config, "adapter.kind", name)
            set_value(config, key, value)
            validate(config)
    config = Config()
    set_value(config, "adapter.kind", name)
    for key, value in method.protocol.items():
        set_value(config, key, value)
    validate(config)
    assert method.cites and method.trains and method.unseen_rule


# ---------------------------------------------------------------- frozen features, once


def test_a_frozen_image_tower_trains_on_features_computed_once(tmp_path, weights, eurosat):
    """A frozen method's run computes each training image's feature once and trains every epoch
    on it: the same losses and accuracy as encoding the images every step, and a second run on
    the same split (another trial) reads the features from the dataset's prefix cache."""
    cache = tmp_path / "cache"

    class PerStep(Trainer):  # the images through the frozen tower at every step
        def trains_on_features(self) -> bool:
            return False

    def config(name: str):
        return _config(tmp_path / name, weights, eurosat, "linear_probe", "train.epochs=2",
                       f"data.prefix_cache_dir={cache}")

    once = Trainer(config("once"))
    assert once.trains_on_features()
    cached = once.fit()
    assert once.task.image_features_given
    stepped = PerStep(config("stepped")).fit()
    steps = json.loads((tmp_path / "stepped" / "metrics.json").read_text())["history"]
    assert len(once.history) == len(steps) == 2
    for a, b in zip(once.history, steps):
        assert a["train/ce"] == pytest.approx(b["train/ce"], rel=1e-5, abs=1e-6)
    assert cached.final_metrics["test/acc"] == stepped.final_metrics["test/acc"]
    # the first run stored the training images' features; the second trial finds them
    again = Trainer(config("again"))
    again.fit()
    served = again.history[-1]["prefix_cache/served"]
    assert served >= len(again.splits["train"].images)
    # augmentation would draw new views every epoch: the frozen methods fix it off, in one line
    with pytest.raises(ConfigError, match=r"linear_probe runs with data\.augment=false .*"
                                          r"this config has data\.augment=true"):
        Trainer(_config(tmp_path / "aug", weights, eurosat, "linear_probe", "data.augment=true"))
