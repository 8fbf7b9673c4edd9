"""The training-step memory estimate (vacsr/model/memory.py) against hand counts and torch."""
from __future__ import annotations

import contextlib

import open_clip
import pytest
import torch
from open_clip.transformer import ResidualAttentionBlock

from vacsr.config import AdapterConfig, load_config
from vacsr.model.adapter import VariationalSimilarityAdapter
from vacsr.model.backbone import register_model_configs
from vacsr.model.configs import model_config
from vacsr.model.gpo import GPO
from vacsr.model.memory import (
    C_FROZEN,
    C_TRAINABLE,
    adapter_params,
    estimate_for_config,
    estimate_step_memory,
    gpo_params,
    towers,
)

# vacsr-tiny by hand: W = 64, 3 blocks per tower, 8 px patches of 32 px images, embed 64
BLOCK = 12 * 64 * 64 + 13 * 64  # in_proj 3W^2+3W, out_proj W^2+W, 2 LN 4W, MLP 8W^2+5W
IMAGE = 3 * BLOCK + 3 * 8 * 8 * 64 + 64 + 17 * 64 + 4 * 64 + 64 * 64  # conv1 cls pos LNs proj
TEXT = 3 * BLOCK + 49408 * 64 + 16 * 64 + 2 * 64 + 64 * 64 + 1  # tokens pos ln_final proj scale
ADAPTER = (64 * 512 + 512) + (512 * 2 * 65 + 2 * 65) + (32 * 64 + 64) + (64 + 1)  # fc1 fc2 dec
GPO_PARAMS = 2 * 3 * (32 * 32 + 32 * 32 + 2 * 32) + 32  # bidirectional GRU 32 -> 32, score


def test_parameter_part_matches_a_hand_count_and_open_clip():
    assert (IMAGE, TEXT) == (167_744, 3_317_313)
    image, text, embed = towers("vacsr-tiny")
    assert (image.params(), text.params(), embed) == (IMAGE, TEXT, 64)
    register_model_configs()
    model = open_clip.create_model("vacsr-tiny")
    assert sum(p.numel() for p in model.parameters()) == IMAGE + TEXT

    parts = estimate_step_memory("vacsr-tiny", batch_size=8, dtype="bf16")
    assert parts["weights"] == 4 * (IMAGE + TEXT + ADAPTER + 2 * GPO_PARAMS)
    trainable = 6 * BLOCK + 2 * (2 * 64 + 64 * 64) + ADAPTER + 2 * GPO_PARAMS  # + projections
    assert parts["optimizer"] == 12 * trainable  # fp32 grad + AdamP's two moments
    assert parts["casts"] == 2 * 6 * BLOCK
    frozen = estimate_step_memory("vacsr-tiny", batch_size=8, image_blocks=0, text_blocks=0,
                                  train_projections=False)
    assert frozen["optimizer"] == 12 * (ADAPTER + 2 * GPO_PARAMS) and frozen["casts"] == 0


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", ["vacsr-tiny", "ViT-B-16"])
def test_the_counts_read_from_the_config_file_are_the_built_models(name):
    """The estimate reads each tower's size from the config file alone (no open_clip, no
    torch): it equals the model open_clip builds, tower by tower (on the meta device: shapes
    without memory)."""
    register_model_configs()
    with torch.device("meta"):
        model = open_clip.create_model(name, device="meta")
    image, text, embed = towers(name)
    assert image.params() == _count(model.visual)
    assert text.params() == _count(model) - _count(model.visual)
    assert embed == model.text_projection.shape[1]


@pytest.mark.parametrize("embed, hidden, adapter", [
    (64, 64, AdapterConfig()), (512, 512, AdapterConfig()),
    (64, 32, AdapterConfig(latent_dim=8, num_components=1, decoder_hidden_dim=0)),
    (64, 16, AdapterConfig(latent_dim=4, num_components=3, decoder_hidden_dim=5))])
def test_the_head_counts_are_the_built_modules(embed, hidden, adapter):
    built = VariationalSimilarityAdapter(
        embed_dim=embed, hidden_dim=hidden, latent_dim=adapter.latent_dim,
        num_components=adapter.num_components, decoder_hidden_dim=adapter.decoder_hidden_dim,
        init="random")
    assert adapter_params(embed, hidden, adapter) == _count(built)
    assert adapter_params(64, 512) == ADAPTER  # the adapter's own defaults
    assert gpo_params() == _count(GPO()) == GPO_PARAMS
    assert gpo_params(8, 4) == _count(GPO(pe_dim=8, hidden_dim=4))


def test_model_configs_read_as_files_are_what_open_clip_returns():
    """Every name open_clip knows (vacsr's own registered), read without importing it."""
    register_model_configs()
    names = open_clip.list_models()
    assert "vacsr-tiny" in names and "ViT-B-16" in names
    for name in names:
        assert model_config(name) == open_clip.get_model_config(name), name
    for name in ("hf-hub:org/repo", "local-dir:/tmp", "../ViT-B-16", "no-such-model", ""):
        assert model_config(name) is None, name


def test_estimate_grows_with_batch_and_activation_bytes():
    small, large = (estimate_step_memory("ViT-B-16", batch_size=b) for b in (64, 128))
    assert large["total"] > small["total"]
    assert large["weights"] == small["weights"] and large["optimizer"] == small["optimizer"]
    assert large["activations"] == 2 * small["activations"]  # linear in B (B' = B)
    fp32 = estimate_step_memory("ViT-B-16", batch_size=128, dtype="fp32")
    assert fp32["activations"] > large["activations"] and fp32["casts"] == 0
    math_attention = estimate_step_memory("ViT-B-16", batch_size=128, fused_attention=False)
    assert math_attention["activations"] - large["activations"] == 128 * 12 * (
        12 * 197 ** 2 * 2 + 8 * 77 ** 2 * 2)  # B heads T^2 bf16, 12 + 12 blocks (12, 8 heads)
    config = load_config(overrides=["model.name=ViT-B-16", "train.batch_size=128",
                                    "adapter.hidden_dim=512"])
    assert estimate_for_config(config) == large


def _saved_bytes_per_token(trainable: bool, bf16: bool, batch: int, width: int = 64,
                           tokens: int = 17) -> float:
    """Bytes torch saves for backward in one open_clip block, per (B, T, D) element, excluding
    parameters (the slope over two batch sizes removes constant terms such as weight casts)."""
    sizes = []
    for rows in (batch, 2 * batch):
        block = ResidualAttentionBlock(width, 2).requires_grad_(trainable)
        params = {p.untyped_storage().data_ptr() for p in block.parameters()}
        x = torch.randn(rows, tokens, width, requires_grad=True)
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = t.untyped_storage().data_ptr()
            if key not in params:
                saved[key] = t.untyped_storage().nbytes()
            return t

        cast = (torch.autocast("cpu", dtype=torch.bfloat16) if bf16
                else contextlib.nullcontext())
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast:
            block(x)
        sizes.append(sum(saved.values()))  # the block input x is one of them
    return (sizes[1] - sizes[0]) / (batch * tokens * width)


@pytest.mark.parametrize("trainable, c", [(True, C_TRAINABLE), (False, C_FROZEN)])
@pytest.mark.parametrize("bf16", [False, True])
def test_per_block_activation_count_matches_torch(trainable, c, bf16):
    s, r = (2, 4) if bf16 else (4, 4)
    measured = _saved_bytes_per_token(trainable, bf16, batch=4)
    assert measured == pytest.approx((c - 2) * s + 2 * r, abs=0.5)  # + the (B, h, T) log-sum-exp


def _saved_activation_bytes(side: str, blocks: int, batch: int) -> int:
    """Bytes torch saves for backward in vacsr-tiny's image tower (parameters excluded)."""
    from vacsr.model.backbone import ClipBackbone

    backbone = ClipBackbone(name="vacsr-tiny", use_gpo=False, trainable_image_blocks=blocks,
                            trainable_text_blocks=0, trainable_side=side)
    params = {p.untyped_storage().data_ptr() for p in backbone.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        backbone.encode_image(torch.randn(batch, 3, 32, 32))
    return sum(saved.values())


def test_with_the_last_blocks_training_activations_start_at_the_first_trainable_block():
    """first 1 of 3: the gradient crosses all 3 blocks; last 1: only the top block keeps its
    activations (the frozen prefix runs without autograd). The estimate's difference between the
    sides matches torch's saved tensors."""
    def estimate(side: str, batch: int) -> int:
        return estimate_step_memory("vacsr-tiny", batch_size=batch, dtype="fp32", image_blocks=1,
                                    text_blocks=0, use_gpo=False, side=side,
                                    texts=1)["activations"]

    slopes = {side: (_saved_activation_bytes(side, 1, 16) - _saved_activation_bytes(side, 1, 8))
              for side in ("first", "last")}
    predicted = {side: estimate(side, 16) - estimate(side, 8) for side in ("first", "last")}
    assert predicted["last"] < predicted["first"]
    assert predicted["first"] - predicted["last"] == pytest.approx(
        slopes["first"] - slopes["last"], rel=0.1)
    full = estimate_step_memory("vacsr-tiny", batch_size=8, image_blocks=3, side="last")
    assert full == estimate_step_memory("vacsr-tiny", batch_size=8, image_blocks=3)  # all: same


def test_a_deep_methods_hooked_blocks_keep_their_activations():
    """MMA's adapters on the 7 highest blocks of a frozen ViT-B/16: the gradient crosses those
    blocks, so their activations count as a frozen block's on the path; nothing else changes."""
    frozen = estimate_step_memory("ViT-B-16", batch_size=16, image_blocks=0, text_blocks=0,
                                  train_projections=False, use_gpo=False, texts=10)
    hooked = estimate_step_memory("ViT-B-16", batch_size=16, image_blocks=0, text_blocks=0,
                                  train_projections=False, use_gpo=False, texts=10,
                                  hooked=(7, 7))
    assert hooked["activations"] > frozen["activations"]
    assert {k: v for k, v in hooked.items() if k not in ("activations", "casts", "total")} == \
        {k: v for k, v in frozen.items() if k not in ("activations", "casts", "total")}
    assert hooked["total"] - frozen["total"] == (hooked["activations"] - frozen["activations"]
                                                 + hooked["casts"] - frozen["casts"])
