import pytest
import torch
import torch.nn.functional as F

from vacsr.config import AdapterConfig
from vacsr.model.adapter import SigmoidBaselineHead, VariationalSimilarityAdapter, head_from_config


def _feats(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, d, generator=g), dim=-1)


def _explicit_scores(adapter, v, t):
    """Reference: build every s_ij = d * (v_i * t_j) and run the MLP pair by pair."""
    logits = torch.empty(v.shape[0], t.shape[0])
    sigmas = torch.empty_like(logits)
    for i in range(v.shape[0]):
        for j in range(t.shape[0]):
            s = v.shape[1] * v[i] * t[j]  # (d,)
            mu, logvar, weights = adapter.encode_pairs(s)
            logits[i, j] = adapter.decode(mu, weights)
            sigmas[i, j] = adapter.uncertainty(logvar, weights)
    return logits, sigmas


@pytest.mark.parametrize("components, decoder_hidden", [(2, 16), (1, 0), (3, 8)])
def test_gemm_form_equals_per_pair_mlp(components, decoder_hidden):
    adapter = VariationalSimilarityAdapter(embed_dim=24, hidden_dim=40, latent_dim=6,
                                           num_components=components,
                                           decoder_hidden_dim=decoder_hidden).eval()
    v, t = _feats(5, 24, 1), _feats(7, 24, 2)
    logits, sigma = adapter.score_block(v, t)
    ref_logits, ref_sigma = _explicit_scores(adapter, v, t)
    assert logits.shape == (5, 7)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sigma, ref_sigma, rtol=1e-5, atol=1e-6)
    # forward without sampling is the same function, with gradients
    out = adapter(v, t, sample=False)
    torch.testing.assert_close(out.logits, logits)
    assert out.mu.shape == (5, 7, components, 6) and out.mix_weights.shape == (5, 7, components)
    torch.testing.assert_close(out.mix_weights.sum(-1), torch.ones(5, 7))


def test_training_mode_samples_and_eval_does_not():
    adapter = VariationalSimilarityAdapter(embed_dim=16, hidden_dim=32, latent_dim=4)
    v, t = _feats(3, 16, 3), _feats(4, 16, 4)
    a, b = adapter(v, t).logits, adapter(v, t).logits  # training mode: z is sampled
    assert not torch.allclose(a, b)
    adapter.eval()
    torch.testing.assert_close(adapter(v, t).logits, adapter(v, t).logits)


def test_sigma_hat_bounded_or_exp():
    bounded = VariationalSimilarityAdapter(embed_dim=16, hidden_dim=32, latent_dim=4)
    with torch.no_grad():
        bounded.fc2.bias.add_(5.0)  # push logvar large: sigmoid stays < 1, exp does not
    v, t = _feats(3, 16, 5), _feats(3, 16, 6)
    _, sigma = bounded.score_block(v, t)
    assert ((sigma > 0) & (sigma < 1)).all()
    unbounded = VariationalSimilarityAdapter(embed_dim=16, hidden_dim=32, latent_dim=4,
                                             bounded_sigma=False)
    unbounded.load_state_dict(bounded.state_dict())
    _, sigma_exp = unbounded.score_block(v, t)
    assert (sigma_exp > 1).all()
    torch.testing.assert_close(torch.sigmoid(torch.log(sigma_exp)), sigma)


def test_baseline_head_is_scaled_cosine():
    head = SigmoidBaselineHead()
    v, t = _feats(3, 8, 7), _feats(4, 8, 8)
    logits, sigma = head.score_block(v, t)
    assert sigma is None
    torch.testing.assert_close(logits, 10.0 * v @ t.T - 10.0)


# ---------------------------------------------------------------- cosine-preserving init
COSINE_SHAPES = [dict(components=2, decoder_hidden=64), dict(components=1, decoder_hidden=0),
                 dict(components=3, decoder_hidden=2)]


def _cosine_adapter(shape) -> VariationalSimilarityAdapter:
    torch.manual_seed(0)
    return VariationalSimilarityAdapter(embed_dim=48, hidden_dim=40, latent_dim=6,
                                        num_components=shape["components"],
                                        decoder_hidden_dim=shape["decoder_hidden"], init="cosine")


@pytest.mark.parametrize("shape", COSINE_SHAPES)
def test_cosine_init_starts_at_the_baseline_head(shape):
    adapter = _cosine_adapter(shape).eval()
    v, t = _feats(13, 48, 11), _feats(17, 48, 12)
    baseline, _ = SigmoidBaselineHead().score_block(v, t)
    logits, sigma = adapter.score_block(v, t)
    torch.testing.assert_close(logits, baseline, atol=1e-5, rtol=0)
    torch.testing.assert_close(adapter(v, t).logits, baseline, atol=1e-5, rtol=0)  # eval: z = mu
    assert ((sigma > 0) & (sigma < 1)).all() and sigma.std() > 0  # the uncertainty head is random


def test_random_init_is_not_the_baseline():
    torch.manual_seed(0)
    adapter = VariationalSimilarityAdapter(embed_dim=48, hidden_dim=40, latent_dim=6,
                                           init="random").eval()
    v, t = _feats(13, 48, 11), _feats(17, 48, 12)
    baseline, _ = SigmoidBaselineHead().score_block(v, t)
    assert (adapter.score_block(v, t)[0] - baseline).abs().max() > 1.0


def test_cosine_init_every_parameter_learns_after_one_step():
    from vacsr.model.losses import vacsr_loss

    torch.manual_seed(0)
    adapter = VariationalSimilarityAdapter(embed_dim=32, hidden_dim=24, latent_dim=4,
                                           decoder_hidden_dim=8, init="cosine")
    optim = torch.optim.Adam(adapter.parameters(), lr=1e-2)
    v, t = _feats(8, 32, 13), _feats(8, 32, 14)
    labels = torch.eye(8)
    for _ in range(2):
        optim.zero_grad(set_to_none=True)
        loss, _ = vacsr_loss(adapter(v, t), labels)
        loss.backward()
        optim.step()
    # every unit learns: each weight row and each bias entry has a non-zero gradient
    silent = [name for name, p in adapter.named_parameters()
              if p.grad is None or not (p.grad.abs().reshape(p.shape[0], -1) > 0).any(1).all()]
    assert not silent


@pytest.mark.parametrize("shape", COSINE_SHAPES)
def test_cosine_init_training_noise_moves_the_logit_by_its_own_size(shape):
    """In training z is sampled; at the cosine start the logit must move by the noise on z_0
    itself, sum_k alpha_k eps_k0 exp(logvar_k0 / 2), not by logit_scale (10) times it, which
    drowns 10 cos in noise at the first steps."""
    adapter = _cosine_adapter(shape).train()
    v, t = _feats(9, 48, 21), _feats(10, 48, 22)
    mu, logvar, alpha = adapter.encode_hidden(adapter.first_layer(v, t))
    at_mu = adapter.head(mu, logvar, alpha, sample=False).logits  # (B, B')
    torch.manual_seed(5)
    sampled = adapter.head(mu, logvar, alpha, sample=True).logits
    torch.manual_seed(5)
    eps = torch.randn_like(mu)  # the head's own draw
    noise_on_z0 = (alpha * eps[..., 0] * torch.exp(0.5 * logvar[..., 0])).sum(-1)  # (B, B')
    torch.testing.assert_close(sampled - at_mu, noise_on_z0, atol=1e-4, rtol=1e-4)
    assert noise_on_z0.abs().max() > 0.1  # the noise is there, and of order one


def test_cosine_init_needs_the_pair_units():
    with pytest.raises(ValueError, match="hidden_dim >= 2"):
        VariationalSimilarityAdapter(embed_dim=8, hidden_dim=1, init="cosine")
    with pytest.raises(ValueError, match="decoder_hidden_dim 0 or >= 2"):
        VariationalSimilarityAdapter(embed_dim=8, decoder_hidden_dim=1, init="cosine")
    with pytest.raises(ValueError, match="init: expected one of random, cosine"):
        VariationalSimilarityAdapter(embed_dim=8, init="zeros")


def test_config_init_reaches_the_model():
    from vacsr.config import load_config
    from vacsr.errors import ConfigError
    from vacsr.methods.build import build_model

    model = build_model(load_config(overrides=["adapter.init=cosine", "adapter.hidden_dim=16",
                                               "adapter.decoder_hidden_dim=4"])).eval()
    dim = model.backbone.embed_dim
    v, t = _feats(5, dim, 15), _feats(6, dim, 16)
    torch.testing.assert_close(model.score(v, t)[0], 10.0 * v @ t.T - 10.0, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match=r"adapter\.init: expected one of random, cosine"):
        load_config(overrides=["adapter.init=zeros"])
    with pytest.raises(ConfigError, match=r"adapter\.decoder_hidden_dim: expected 0 or >= 2"):
        load_config(overrides=["adapter.init=cosine", "adapter.decoder_hidden_dim=1"])


def test_head_from_config_honours_every_adapter_field():
    """Each AdapterConfig field reaches the adapter: none dropped, none left at its default."""
    config = AdapterConfig(hidden_dim=16, latent_dim=4, num_components=3, decoder_hidden_dim=0,
                           bounded_sigma=False, logvar_bound=3.0, init_logit_bias=-2.0,
                           init="random")
    head = head_from_config(config, embed_dim=8)
    assert isinstance(head, VariationalSimilarityAdapter)
    assert head.fc1.in_features == 8 and head.fc1.out_features == 16
    assert (head.latent_dim, head.num_components) == (4, 3)
    assert head.fc2.out_features == 3 * (2 * 4 + 1)
    assert isinstance(head.decoder, torch.nn.Linear) and head.decoder.bias.item() == -2.0
    assert head.bounded_sigma is False and head.logvar_bound == 3.0
    cosine = head_from_config(AdapterConfig(hidden_dim=16, latent_dim=4, decoder_hidden_dim=0),
                              embed_dim=8)
    assert cosine.decoder.bias.item() == -10.0  # init="cosine": the baseline head's start
