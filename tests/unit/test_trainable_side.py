"""model.trainable_side: the N trainable blocks at either end of each tower, the frozen prefix
run without autograd, and its outputs cached for evaluation passes (vacsr/model/prefix.py,
vacsr/model/prefix_cache.py)."""
from __future__ import annotations

import pytest
import torch

from vacsr.config import load_config, validate
from vacsr.errors import ConfigError
from vacsr.methods.build import build_model
from vacsr.model import prefix
from vacsr.model.backbone import ClipBackbone


def _trainable_blocks(backbone, tower: str) -> list[int]:
    return [i for i, block in enumerate(prefix.blocks(backbone.clip, tower))
            if any(p.requires_grad for p in block.parameters())]


def test_the_side_says_which_end_of_each_tower_trains():
    first = ClipBackbone(trainable_image_blocks=1, trainable_text_blocks=2)
    last = ClipBackbone(trainable_image_blocks=1, trainable_text_blocks=2, trainable_side="last")
    assert (_trainable_blocks(first, "image"), _trainable_blocks(first, "text")) == ([0], [0, 1])
    assert (_trainable_blocks(last, "image"), _trainable_blocks(last, "text")) == ([2], [1, 2])
    assert (last.frozen_depth("image"), last.frozen_depth("text")) == (2, 1)
    assert first.frozen_depth("image") == 0  # the first-N reading runs open_clip's forward
    none = ClipBackbone(trainable_image_blocks=0, trainable_text_blocks=0, trainable_side="last")
    assert (_trainable_blocks(none, "image"), none.frozen_depth("image")) == ([], 3)
    # the same parameters outside the blocks train either way
    names = {n for n, p in first.named_parameters() if p.requires_grad and "resblocks" not in n}
    assert names == {n for n, p in last.named_parameters()
                     if p.requires_grad and "resblocks" not in n}


def test_impossible_sides_and_counts_are_one_line():
    with pytest.raises(ConfigError, match=r"^model.trainable_side: expected one of first, last, "
                                          r"got 'middle'$"):
        validate(load_config(overrides=["model.trainable_side=middle"]))
    with pytest.raises(ConfigError, match="model.trainable_image_blocks: 4 exceeds the 3 blocks"):
        ClipBackbone(trainable_image_blocks=4, trainable_side="last")


@pytest.mark.parametrize("use_gpo", [False, True])
def test_the_split_forward_is_open_clips_forward(use_gpo):
    backbone = ClipBackbone(use_gpo=use_gpo, trainable_image_blocks=0,
                            trainable_text_blocks=0).eval()
    images = torch.randn(4, 3, 32, 32)
    tokens = backbone.tokenize(["a photo of a cat.", "dog", "a b c d e f g"])
    image_ref, text_ref = backbone.encode_image(images), backbone.encode_text(tokens)
    for depth in range(4):
        hidden = prefix.image_prefix(backbone, images, depth)
        assert hidden.shape[1] == (1 if depth == 3 and not use_gpo else 17)
        torch.testing.assert_close(prefix.image_suffix(backbone, hidden, depth), image_ref,
                                   rtol=0, atol=1e-6)
        hidden = prefix.text_prefix(backbone, tokens, depth)
        torch.testing.assert_close(prefix.text_suffix(backbone, hidden, tokens, depth),
                                   text_ref, rtol=0, atol=1e-6)


def test_last_n_gives_the_gradients_of_the_whole_graph_and_records_no_prefix():
    """With the last block training, the prefix runs under no_grad: the trainable block's
    gradients equal those of open_clip's forward, and the frozen blocks are never in the graph."""
    torch.manual_seed(0)
    images = torch.randn(4, 3, 32, 32)
    backbone = ClipBackbone(use_gpo=False, trainable_image_blocks=1, trainable_text_blocks=0,
                            trainable_side="last")
    grads = []
    for split in (True, False):
        backbone.zero_grad(set_to_none=True)
        feats = (backbone.encode_image(images) if split
                 else backbone.clip.encode_image(images, normalize=True))
        feats[:, 0].sum().backward()
        grads.append([p.grad.clone() for p in prefix.blocks(backbone.clip, "image")[2]
                      .parameters()])
    for split_grad, whole_grad in zip(*grads):
        torch.testing.assert_close(split_grad, whole_grad, rtol=1e-5, atol=1e-7)
    seen = []
    hook = prefix.blocks(backbone.clip, "image")[1].register_forward_hook(
        lambda module, args, out: seen.append(out.requires_grad or torch.is_grad_enabled()))
    backbone.encode_image(images)
    hook.remove()
    assert seen == [False]  # the frozen block ran without autograd


def test_class_prompts_pass_the_frozen_prefix_once_with_the_last_text_blocks_training():
    from vacsr.tasks import ClassificationTask

    config = load_config(overrides=["model.use_gpo=false", "model.trainable_text_blocks=1",
                                    "model.trainable_side=last"])
    model = build_model(config).train()
    tokens = model.backbone.tokenize([f"a photo of a class {i}." for i in range(5)])
    expected = model.backbone.clip.encode_text(tokens, normalize=True)
    calls = []
    prefix.blocks(model.backbone.clip, "text")[0].register_forward_hook(
        lambda *args: calls.append(1))
    task = ClassificationTask(model, config.loss, tokens)
    for _ in range(3):
        feats = task.class_features("cpu")
        torch.testing.assert_close(feats, expected, rtol=1e-5, atol=1e-6)
        feats.sum().backward()
    assert len(calls) == 1  # the frozen block once, the last block every step
    assert prefix.blocks(model.backbone.clip, "text")[2].mlp.c_fc.weight.grad is not None


def test_a_sweep_whose_fixed_block_count_exceeds_the_tower_is_refused_before_ray(tmp_path,
                                                                                capsys):
    import ray

    from conftest import make_dataset_folders, nothing_written, one_line
    from sweeps.base2novel import SWEEP
    from vacsr.sweep import cli

    data = make_dataset_folders(tmp_path / "data")
    line = one_line(["--datasets", "eurosat", "--data-root", data, "--storage", tmp_path / "out",
                     "--set", "model.trainable_text_blocks=5"], capsys,
                    entry=lambda argv: cli.main(SWEEP, argv))
    assert line == ("vacsr: error: model.trainable_text_blocks: 5 exceeds the 3 blocks of the "
                    "text tower of vacsr-tiny (eurosat)")
    assert not ray.is_initialized()
    nothing_written(tmp_path / "out")
