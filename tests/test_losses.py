import math

import pytest
import torch
from torch.distributions import Independent, Normal, kl_divergence

from vacsr.model.adapter import AdapterOutput
from vacsr.model.losses import (hard_negative_masks, kl_upper_bound, match_probability,
                                sigma_loss, vacsr_loss)


def _output(b=4, b2=5, k=2, l=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(b, b2, k, l, generator=g)
    logvar = torch.randn(b, b2, k, l, generator=g) * 0.5
    weights = torch.softmax(torch.randn(b, b2, k, generator=g), dim=-1)
    logits = torch.randn(b, b2, generator=g, requires_grad=True)
    sigma = torch.sigmoid(torch.randn(b, b2, generator=g))
    return AdapterOutput(logits=logits, sigma_hat=sigma, mu=mu, logvar=logvar,
                         mix_weights=weights)


def test_kl_bound_is_closed_form_per_component():
    out = _output()
    bound = kl_upper_bound(out.mu, out.logvar, out.mix_weights)  # (B, B')
    q = Independent(Normal(out.mu, torch.exp(0.5 * out.logvar)), 1)
    prior = Independent(Normal(torch.zeros_like(out.mu), torch.ones_like(out.mu)), 1)
    per_component = kl_divergence(q, prior)  # (B, B', K)
    torch.testing.assert_close(bound, (out.mix_weights * per_component).sum(-1))


def test_kl_bound_upper_bounds_monte_carlo_mixture_kl():
    torch.manual_seed(1)
    mu = torch.tensor([[-1.5, 0.3], [1.0, -0.7]])  # K=2, L=2
    logvar = torch.tensor([[-0.5, 0.2], [0.1, -1.0]])
    weights = torch.tensor([0.3, 0.7])
    components = Normal(mu, torch.exp(0.5 * logvar))
    which = torch.multinomial(weights, 200_000, replacement=True)
    z = components.sample((200_000,))[torch.arange(200_000), which]  # (S, L)
    log_q = torch.logsumexp(torch.log(weights) + components.log_prob(z[:, None]).sum(-1), dim=1)
    log_p = Normal(0.0, 1.0).log_prob(z).sum(-1)
    mixture_kl = (log_q - log_p).mean()
    bound = kl_upper_bound(mu, logvar, weights)
    assert mixture_kl < bound - 0.05  # strictly looser for separated components
    assert mixture_kl > 0


def test_straight_through_gradient_is_minus_residual():
    logits = torch.tensor([[-6.0, 0.5], [3.0, 8.0]], requires_grad=True)
    labels = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    prob = match_probability(logits, straight_through=True)
    (0.5 * (labels - prob).pow(2)).sum().backward()
    expected = -(labels - torch.sigmoid(logits.detach()))
    torch.testing.assert_close(logits.grad, expected)
    torch.testing.assert_close(prob, torch.sigmoid(logits.detach()))
    # without it the sigmoid derivative scales (and at saturation kills) the gradient
    logits.grad = None
    prob = match_probability(logits, straight_through=False)
    (0.5 * (labels - prob).pow(2)).sum().backward()
    p = torch.sigmoid(logits.detach())
    torch.testing.assert_close(logits.grad, expected * p * (1 - p))


def test_hard_negatives_per_row_and_column():
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(6, 7, generator=g)
    labels = torch.zeros(6, 7)
    labels[torch.arange(6), torch.arange(6)] = 1
    labels[0, 6] = 1
    for n in (1, 2, 4):
        rows, cols = hard_negative_masks(scores, labels, n)
        assert not (rows & labels.bool()).any() and not (cols & labels.bool()).any()
        for i in range(6):
            negs = [(scores[i, j].item(), j) for j in range(7) if labels[i, j] == 0]
            best = {j for _, j in sorted(negs, reverse=True)[:n]}
            assert set(rows[i].nonzero().flatten().tolist()) == best
        for j in range(7):
            negs = [(scores[i, j].item(), i) for i in range(6) if labels[i, j] == 0]
            best = {i for _, i in sorted(negs, reverse=True)[:n]}
            assert set(cols[:, j].nonzero().flatten().tolist()) == best


def test_hard_negatives_when_a_column_has_too_few():
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    labels = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    rows, cols = hard_negative_masks(scores, labels, 5)
    assert rows.sum() == 2 and cols.sum() == 2  # one negative each, positives never picked


@pytest.mark.parametrize("target, prob", [(1.0, 0.3), (0.0, 0.6), (1.0, 0.9)])
def test_sigma_loss_minimum_is_half_squared_residual(target, prob):
    grid = torch.linspace(1e-3, 1.0, 20_000)
    values = sigma_loss(torch.tensor(target), torch.tensor(prob), grid)
    best = grid[values.argmin()].item()
    assert best == pytest.approx((target - prob) ** 2 / 2, abs=1e-3)


def test_total_loss_composition_and_switches():
    out = _output(seed=5)
    labels = torch.zeros(4, 5)
    labels[torch.arange(4), torch.arange(4)] = 1
    full, parts = vacsr_loss(out, labels, alpha_kl=0.5, beta=2.0, gamma=3.0)
    expected = 0.5 * parts["kl"] + 2.0 * (parts["recon"] + 3.0 * (parts["sigma_pos"]
                                                                  + parts["sigma_neg"]))
    torch.testing.assert_close(full.detach(), expected)
    no_kl, _ = vacsr_loss(out, labels, alpha_kl=0.5, beta=2.0, gamma=3.0, use_kl=False)
    torch.testing.assert_close((full - no_kl).detach(), 0.5 * parts["kl"])
    no_sigma, _ = vacsr_loss(out, labels, alpha_kl=0.5, beta=2.0, gamma=3.0, use_sigma_loss=False)
    torch.testing.assert_close(no_sigma.detach(), 0.5 * parts["kl"] + 2.0 * parts["recon"])
    # recon is over every pair: 1/2 mean (y - p)^2
    p = torch.sigmoid(out.logits.detach())
    assert parts["recon"].item() == pytest.approx((0.5 * (labels - p) ** 2).mean().item(), rel=1e-6)


def test_negative_sigma_target_switch():
    out = _output(seed=6)
    labels = torch.eye(4, 5)
    _, as_label = vacsr_loss(out, labels, neg_sigma_target="label")
    _, as_positive = vacsr_loss(out, labels, neg_sigma_target="positive")
    rows, cols = hard_negative_masks(out.logits, labels, 1)
    p = torch.sigmoid(out.logits.detach())
    for target, parts in ((0.0, as_label), (1.0, as_positive)):
        values = (target - p) ** 2 / (2 * out.sigma_hat) + torch.log(out.sigma_hat)
        expected = ((values * rows).sum() + (values * cols).sum()) / (rows.sum() + cols.sum())
        assert parts["sigma_neg"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert not math.isclose(as_label["sigma_neg"].item(), as_positive["sigma_neg"].item())
