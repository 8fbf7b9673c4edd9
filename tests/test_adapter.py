import pytest
import torch
import torch.nn.functional as F

from vacsr.model.adapter import SigmoidBaselineHead, VariationalSimilarityAdapter


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
