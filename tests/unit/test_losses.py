import math

import pytest
import torch
from torch.distributions import Independent, Normal, kl_divergence

from conftest import small_adapter
from vacsr.model.adapter import AdapterOutput
from vacsr.model.losses import (
    hard_negative_masks,
    kl_upper_bound,
    match_probability,
    sigma_loss,
    vacsr_loss,
)


def _output(b=4, b2=5, k=2, latent=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(b, b2, k, latent, generator=g)
    logvar = torch.randn(b, b2, k, latent, generator=g) * 0.5
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
    full, parts = vacsr_loss(out, labels, alpha_kl=0.5, beta=2.0, gamma=3.0,
                             reduction="pair_mean")
    expected = 0.5 * parts["kl"] + 2.0 * (parts["recon"] + 3.0 * (parts["sigma_pos"]
                                                                  + parts["sigma_neg"]))
    torch.testing.assert_close(full.detach(), expected)
    no_kl, _ = vacsr_loss(out, labels, alpha_kl=0.5, beta=2.0, gamma=3.0, use_kl=False,
                          reduction="pair_mean")
    torch.testing.assert_close((full - no_kl).detach(), 0.5 * parts["kl"])
    no_sigma, _ = vacsr_loss(out, labels, alpha_kl=0.5, beta=2.0, gamma=3.0, use_sigma_loss=False,
                             reduction="pair_mean")
    torch.testing.assert_close(no_sigma.detach(), 0.5 * parts["kl"] + 2.0 * parts["recon"])
    # recon is over every pair: 1/2 mean (y - p)^2
    p = torch.sigmoid(out.logits.detach())
    assert parts["recon"].item() == pytest.approx((0.5 * (labels - p) ** 2).mean().item(), rel=1e-6)


def test_negative_sigma_target_switch():
    out = _output(seed=6)
    labels = torch.eye(4, 5)
    _, as_label = vacsr_loss(out, labels, neg_sigma_target="label", reduction="pair_mean")
    _, as_positive = vacsr_loss(out, labels, neg_sigma_target="positive", reduction="pair_mean")
    rows, cols = hard_negative_masks(out.logits, labels, 1)
    p = torch.sigmoid(out.logits.detach())
    for target, parts in ((0.0, as_label), (1.0, as_positive)):
        values = (target - p) ** 2 / (2 * out.sigma_hat) + torch.log(out.sigma_hat)
        expected = ((values * rows).sum() + (values * cols).sum()) / (rows.sum() + cols.sum())
        assert parts["sigma_neg"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert not math.isclose(as_label["sigma_neg"].item(), as_positive["sigma_neg"].item())


# ---------------------------------------------------------------- boundedness (sec. 3.2 L_sigma)
def _loss_floor(adapter, labels, reduction, gamma=1.0, beta=1.0):
    """The lowest value the total loss can take: L_recon, L_KL >= 0 and each L_sigma term
    >= its weight times the smallest log sigma_hat the logvar bound allows."""
    low = adapter.min_log_sigma()
    if reduction == "per_query":  # sums over pairs / B: positives + 2 N_h selections per query
        weight = (labels.sum() + labels.shape[0] + labels.shape[1]) / labels.shape[0]
    else:  # two means
        weight = 2.0
    return beta * gamma * low * float(weight)


@pytest.mark.parametrize("reduction", ["pair_mean", "per_query", "balanced"])
@pytest.mark.parametrize("target", ["label", "positive"])
def test_total_loss_cannot_be_driven_below_its_floor(reduction, target):
    """Minimise the loss itself at a high learning rate: with logvar unbounded it runs off to
    minus infinity (sigma_hat -> 0 on pairs it fits); bounded, it stays above the floor."""
    torch.manual_seed(0)
    adapter = small_adapter(logvar_bound=4.0)
    v = torch.nn.functional.normalize(torch.randn(12, 16), dim=-1)
    t = torch.nn.functional.normalize(torch.randn(12, 16), dim=-1)
    labels = (torch.rand(12, 12) < 0.15).float()
    labels[torch.arange(12), torch.arange(12)] = 1
    floor = _loss_floor(adapter, labels, reduction)
    optim = torch.optim.Adam(adapter.parameters(), lr=0.05)
    lowest = math.inf
    for _ in range(300):
        loss, _ = vacsr_loss(adapter(v, t), labels, neg_sigma_target=target, reduction=reduction)
        assert torch.isfinite(loss)
        lowest = min(lowest, loss.item())
        optim.zero_grad()
        loss.backward()
        optim.step()
    assert lowest >= floor - 1e-4


@pytest.mark.parametrize("target", ["label", "positive"])
def test_unbounded_logvar_runs_below_that_floor(target):
    """The old behaviour: nothing bounds logvar, and the same minimisation goes past the floor
    of the bounded adapter (or non-finite)."""
    torch.manual_seed(0)
    v = torch.nn.functional.normalize(torch.randn(12, 16), dim=-1)
    t = torch.nn.functional.normalize(torch.randn(12, 16), dim=-1)
    labels = (torch.rand(12, 12) < 0.15).float()
    labels[torch.arange(12), torch.arange(12)] = 1
    floor = _loss_floor(small_adapter(logvar_bound=4.0), labels, "pair_mean")
    unbounded = small_adapter(logvar_bound=1e6)
    optim = torch.optim.Adam(unbounded.parameters(), lr=0.05)
    values = []
    for _ in range(300):
        loss, _ = vacsr_loss(unbounded(v, t), labels, neg_sigma_target=target)
        values.append(loss.item())
        if not math.isfinite(values[-1]):
            break
        optim.zero_grad()
        loss.backward()
        optim.step()
    assert not math.isfinite(values[-1]) or min(values) < floor


def test_logvar_bound_keeps_sigma_hat_in_range():
    adapter = small_adapter(logvar_bound=3.0)
    with torch.no_grad():
        adapter.fc2.bias.fill_(1e4)  # pre-activations far past the bound
    out = adapter(torch.eye(16)[:3], torch.eye(16)[:4])
    assert out.logvar.max() <= 3.0 + 1e-6 and out.logvar.min() >= -3.0 - 1e-6
    assert torch.isfinite(out.logits).all()
    assert math.log(out.sigma_hat.min().item()) >= adapter.min_log_sigma() - 1e-6
    with pytest.raises(ValueError, match="logvar_bound"):
        small_adapter(logvar_bound=0.0)


@pytest.mark.parametrize("reduction", ["pair_mean", "per_query", "balanced"])
def test_reductions_of_the_per_pair_terms(reduction):
    out = _output(b=4, b2=6, seed=9)
    labels = torch.zeros(4, 6)
    labels[torch.arange(4), torch.arange(4)] = 1
    _, parts = vacsr_loss(out, labels, reduction=reduction)
    p = torch.sigmoid(out.logits.detach())
    recon = 0.5 * (labels - p) ** 2
    pos = labels.bool()
    rows, cols = hard_negative_masks(out.logits, labels, 1)
    values = p ** 2 / (2 * out.sigma_hat) + torch.log(out.sigma_hat)  # label target: y = 0
    neg_sum = (values * rows).sum() + (values * cols).sum()
    pos_values = (1 - p) ** 2 / (2 * out.sigma_hat) + torch.log(out.sigma_hat)
    if reduction == "pair_mean":
        expected = (recon.mean(), pos_values[pos].mean(), neg_sum / (rows.sum() + cols.sum()))
    elif reduction == "per_query":  # one normaliser, the 4 queries
        expected = (recon.sum() / 4, pos_values[pos].sum() / 4, neg_sum / 4)
    else:
        expected = (recon[pos].mean() + recon[~pos].mean(), pos_values[pos].mean(),
                    neg_sum / (rows.sum() + cols.sum()))
    for name, value in zip(("recon", "sigma_pos", "sigma_neg"), expected):
        assert parts[name].item() == pytest.approx(value.item(), rel=1e-5), name


def test_neg_columns_with_positive_drops_absent_classes():
    out = _output(b=4, b2=6, seed=10)
    labels = torch.zeros(4, 6)
    labels[torch.arange(4), torch.tensor([0, 1, 1, 2])] = 1  # classes 3, 4, 5 absent
    _, every = vacsr_loss(out, labels, neg_columns="all", reduction="pair_mean")
    _, present = vacsr_loss(out, labels, neg_columns="with_positive", reduction="pair_mean")
    rows, cols = hard_negative_masks(out.logits, labels, 1)
    cols = cols & labels.bool().any(0, keepdim=True)
    p = torch.sigmoid(out.logits.detach())
    values = p ** 2 / (2 * out.sigma_hat) + torch.log(out.sigma_hat)
    expected = ((values * rows).sum() + (values * cols).sum()) / (rows.sum() + cols.sum())
    assert present["sigma_neg"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert every["sigma_neg"].item() != pytest.approx(present["sigma_neg"].item())


@pytest.mark.parametrize("target, bounded", [("label", True), ("positive", True),
                                             ("label", False)])
def test_a_thousand_steps_at_a_high_learning_rate_stay_finite(target, bounded):
    """Long training far above any sane learning rate: every loss part stays finite (with
    logvar unbounded the `positive` reading went non-finite within a few hundred steps, so a
    thousand steps leave room past where it broke)."""
    torch.manual_seed(1)
    adapter = small_adapter(bounded_sigma=bounded)
    towers = torch.nn.Linear(16, 16)
    params = [*adapter.parameters(), *towers.parameters()]
    optim = torch.optim.Adam(params, lr=0.1)
    groups = torch.randint(0, 4, (64,))  # same-group items: false negatives in every batch
    raw = torch.randn(4, 16)[groups] + 0.3 * torch.randn(64, 16)
    for step in range(1000):
        index = torch.randperm(64)[:16]
        feats = torch.nn.functional.normalize(towers(raw[index]), dim=-1)
        labels = torch.eye(16)
        for reduction in ("pair_mean", "per_query") if step % 2 else ("balanced",):
            loss, parts = vacsr_loss(adapter(feats, feats), labels, neg_sigma_target=target,
                                     reduction=reduction)
            bad = [k for k, v in parts.items() if not math.isfinite(float(v))]
            assert not bad, f"step {step}: non-finite {bad}"
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 2.0)
        optim.step()
