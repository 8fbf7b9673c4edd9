import pytest
import torch

from vacsr.errors import ConfigError
from vacsr.model.backbone import ClipBackbone
from vacsr.model.gpo import GPO


@pytest.mark.parametrize("image_blocks, text_blocks", [(1, 2), (0, 1), (2, 0)])
def test_only_configured_blocks_receive_gradients(image_blocks, text_blocks):
    backbone = ClipBackbone(trainable_image_blocks=image_blocks, trainable_text_blocks=text_blocks,
                            train_projections=False, use_gpo=False)
    images = torch.randn(2, 3, 32, 32)
    tokens = backbone.tokenize(["a red circle", "a blue cross on the left"])
    (backbone.encode_image(images).sum() + backbone.encode_text(tokens).sum()).backward()
    with_grad = {n for n, p in backbone.clip.named_parameters()
                 if p.grad is not None and p.grad.abs().sum() > 0}
    expected_prefixes = [f"visual.transformer.resblocks.{i}." for i in range(image_blocks)]
    expected_prefixes += [f"transformer.resblocks.{i}." for i in range(text_blocks)]
    assert with_grad, "some block must train"
    assert all(any(n.startswith(p) for p in expected_prefixes) for n in with_grad), with_grad
    for prefix in expected_prefixes:  # every parameter of a trainable block gets a gradient
        block = [n for n, _ in backbone.clip.named_parameters() if n.startswith(prefix)]
        assert set(block) <= with_grad


def test_all_blocks_and_projections():
    backbone = ClipBackbone(trainable_image_blocks=-1, trainable_text_blocks=-1,
                            train_projections=True)
    trainable = {n for n, p in backbone.clip.named_parameters() if p.requires_grad}
    assert "visual.proj" in trainable and "text_projection" in trainable
    assert "visual.transformer.resblocks.2.mlp.c_fc.weight" in trainable
    assert "token_embedding.weight" not in trainable  # embeddings only with train_embeddings


def test_too_many_blocks_and_unknown_model_are_config_errors():
    with pytest.raises(ConfigError, match="trainable_image_blocks"):
        ClipBackbone(trainable_image_blocks=7)
    with pytest.raises(ConfigError, match="unknown open_clip model"):
        ClipBackbone(name="no-such-model")
    with pytest.raises(ConfigError, match="neither a local weights file"):
        ClipBackbone(pretrained="/does/not/exist.pt")


def test_local_weights_file_is_loaded(tmp_path):
    source = ClipBackbone(use_gpo=False)
    path = tmp_path / "w.pt"
    torch.save(source.clip.state_dict(), path)
    loaded = ClipBackbone(pretrained=str(path), use_gpo=False)
    fresh = ClipBackbone(use_gpo=False)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.encode_image(images), source.encode_image(images))
        assert not torch.allclose(fresh.encode_image(images), source.encode_image(images))


def test_gpo_ignores_padding_and_sorts_per_dimension():
    gpo = GPO()
    tokens = torch.randn(2, 6, 8)
    lengths = torch.tensor([4, 6])
    padded = tokens.clone()
    padded[0, 4:] = 100.0  # garbage beyond the length must not matter
    torch.testing.assert_close(gpo(tokens, lengths), gpo(padded, lengths))
    # a permutation of the valid tokens gives the same pooled vector (it sorts first)
    permuted = tokens.clone()
    permuted[1] = tokens[1, torch.randperm(6)]
    torch.testing.assert_close(gpo(tokens, lengths)[1], gpo(permuted, lengths)[1])
    weights = gpo.pooling_weights(lengths, 6)
    torch.testing.assert_close(weights.sum(1).squeeze(-1), torch.ones(2))
    assert weights[0, 4:].abs().sum() == 0


def test_token_features_are_normalised_and_depend_on_text():
    backbone = ClipBackbone()
    tokens = backbone.tokenize(["a red circle on the left", "a green square"])
    features = backbone.encode_text(tokens)
    torch.testing.assert_close(features.norm(dim=-1), torch.ones(2))
    _, lengths = backbone.text_tokens(tokens)
    assert lengths.tolist() == [(t != 0).sum().item() for t in tokens]  # SOT..EOT


def test_image_tokens_are_the_towers_tokens_and_its_pooled_output():
    """The projected tokens equal the vision tower run block by block (its public modules), and
    their class token is what open_clip's own forward pools (pool_type "tok")."""
    backbone = ClipBackbone(use_gpo=True).eval()
    visual = backbone.clip.visual
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        tokens = backbone.image_tokens(images)  # (B, 1+N, D)
        patches = visual.conv1(images).flatten(2).transpose(1, 2)  # (B, N, W)
        cls = visual.class_embedding.expand(images.shape[0], 1, -1)  # (B, 1, W)
        x = visual.ln_pre(torch.cat([cls, patches], dim=1) + visual.positional_embedding)
        expected = visual.ln_post(visual.transformer(x)) @ visual.proj
        pooled = visual(images)  # (B, D)
    assert tokens.shape == expected.shape == (3, 1 + patches.shape[1], backbone.embed_dim)
    torch.testing.assert_close(tokens, expected)
    torch.testing.assert_close(tokens[:, 0], pooled)


def test_class_prompts_pass_the_frozen_text_blocks_once_and_train_the_text_head():
    """Few-shot runs train ln_final and the text projection over frozen text blocks: the whole
    trunk is the frozen prefix (compact: the pooled token), computed once per run, the head every
    step, and the features and gradients are those of open_clip's whole encode_text."""
    from vacsr.config import load_config
    from vacsr.methods.build import build_model
    from vacsr.model import prefix
    from vacsr.tasks import ClassificationTask

    config = load_config(overrides=["model.use_gpo=false", "model.trainable_text_blocks=0",
                                    "model.train_projections=true"])
    model = build_model(config).train()
    backbone = model.backbone
    tokens = backbone.tokenize([f"a photo of a class {i}." for i in range(5)])
    depth = backbone.frozen_depth("text")
    assert depth == len(prefix.blocks(backbone.clip, "text"))
    expected = backbone.clip.encode_text(tokens, normalize=True)
    hidden = prefix.text_prefix(backbone, tokens, depth)
    assert hidden.shape[1] == 1  # the pooled token alone: only ln_final and the projection follow
    torch.testing.assert_close(prefix.text_suffix(backbone, hidden, tokens, depth), expected,
                               rtol=1e-5, atol=1e-6)
    passes = []  # the blocks ran once for three steps (earlier: the prefix above, not counted)
    prefix.blocks(backbone.clip, "text")[0].register_forward_hook(lambda *a: passes.append(1))
    task = ClassificationTask(model, config.loss, tokens)
    for step in range(3):
        features = task.class_features("cpu")
        torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-6)
        features.sum().backward()
    assert len(passes) == 1  # the blocks ran once for three steps
    clip = backbone.clip
    assert clip.text_projection.grad is not None and clip.ln_final.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in clip.transformer.parameters())

    unfrozen = build_model(load_config(overrides=["model.use_gpo=false",
                                                  "model.trainable_text_blocks=1"]))
    assert unfrozen.backbone.frozen_depth("text") == 0  # a training block: every step, whole
