"""The variational similarity adapter (paper section 3.1, Fig. 2) and the baseline head.

A pair (v_i, t_j) meets through the Hadamard product s_ij = d * (v_i * t_j). The encoder maps s_ij
to a K-component Gaussian mixture over a latent z; the decoder maps z to a match logit; sigma_hat
is the pair's bounded uncertainty. The first encoder layer is evaluated in GEMM form,
W1 s_ij = d * (W1 diag(v_i)) t_j, so the (B, B', d) tensor of similarity vectors never exists.

logvar is kept in [-logvar_bound, logvar_bound] by a smooth bound (b * tanh(x / b)): the uncertainty
loss L_sigma = (t - p)^2 / (2 sigma_hat) + log sigma_hat (section 3.2) is unbounded below as
sigma_hat -> 0, so without a bound training can lower the loss without end by shrinking sigma_hat
on pairs it already fits instead of learning to rank (measured: the "positive" reading of
appendix E.1 collapsed below chance and went non-finite). The bound gives
log sigma_hat >= log sigmoid(-logvar_bound) and also bounds the sampling noise exp(logvar / 2).

Initialisation (the paper does not state it, sec. 3.1 and appendix C.2; this is vacsr's choice):
"random" is PyTorch's default with the decoder's output bias at init_logit_bias, so ranking starts
at chance. "cosine" starts the adapter where the sigmoid baseline head starts, at
m = 10 cos(v, t) - 10 for z = mu: two first-layer units compute +g cos and -g cos from s_ij (each
row g/d, since sum(s_ij) = d cos; g = sqrt(d) gives the rows unit norm, so under Adam the cosine
path moves at the pace of the random rows instead of ~sqrt(d) times faster), mu_k0 reads their
difference with weight 10/g (relu(x) - relu(-x) = x), so mu_k0 = 10 cos; the decoder's hidden
layer repeats the pair on z_0 and its output reads it with weight 1 and the baseline's bias. The
logit scale sits in the encoder, not the decoder: the training noise eps exp(logvar / 2) on z_0
then moves the logit by its own size, not 10 times it (with exp(logvar_0 / 2) ~ 1 at a random
start, noise of std ~10 on the logit drowned 10 cos in the first epochs). The decoder's other
output weights start at zero (as LoRA's second matrix), everything else is random as in
"random", so every weight still learns after the first step.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vacsr.config import ADAPTER_INITS, AdapterConfig


@dataclass
class AdapterOutput:
    """Everything the losses and the scorer need for a (B, B') block of pairs."""

    logits: torch.Tensor  # (B, B') m = sum_k alpha_k dec(z_k)
    sigma_hat: torch.Tensor | None  # (B, B') bounded uncertainty; None for the baseline head
    mu: torch.Tensor | None = None  # (B, B', K, L)
    logvar: torch.Tensor | None = None  # (B, B', K, L)
    mix_weights: torch.Tensor | None = None  # (B, B', K) alpha = softmax(mixture logits)


BASELINE_LOGIT_SCALE = 10.0  # SigLIP's initial t' = log 10 and b = -10: the baseline head's start
BASELINE_LOGIT_BIAS = -10.0
_DEFAULT = AdapterConfig()  # the adapter's defaults live in the config, once


class VariationalSimilarityAdapter(nn.Module):
    """Encoder s -> (mu_k, logvar_k, alpha_k), decoder z_k -> m_k; see module docstring."""

    def __init__(self, *, embed_dim: int, hidden_dim: int = _DEFAULT.hidden_dim,
                 latent_dim: int = _DEFAULT.latent_dim,
                 num_components: int = _DEFAULT.num_components,
                 decoder_hidden_dim: int = _DEFAULT.decoder_hidden_dim,
                 bounded_sigma: bool = _DEFAULT.bounded_sigma,
                 logvar_bound: float = _DEFAULT.logvar_bound,
                 init_logit_bias: float = _DEFAULT.init_logit_bias,
                 init: str = _DEFAULT.init) -> None:
        super().__init__()
        if not (logvar_bound > 0 and math.isfinite(logvar_bound)):
            raise ValueError(f"logvar_bound: expected a finite value > 0, got {logvar_bound!r}")
        if init not in ADAPTER_INITS:
            raise ValueError(f"init: expected one of {', '.join(ADAPTER_INITS)}, got {init!r}")
        if init == "cosine" and (hidden_dim < 2 or decoder_hidden_dim == 1):
            raise ValueError("init 'cosine' needs hidden_dim >= 2 and decoder_hidden_dim 0 or >= 2"
                             f", got {hidden_dim} and {decoder_hidden_dim}")
        self.embed_dim = embed_dim
        self.logvar_bound = float(logvar_bound)
        self.latent_dim = latent_dim
        self.num_components = num_components
        self.bounded_sigma = bounded_sigma
        self.scale = float(embed_dim)  # keeps s_ij entries O(1): sum(s_ij) = d * cos(v_i, t_j)
        self.fc1 = nn.Linear(embed_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, num_components * (2 * latent_dim + 1))
        if decoder_hidden_dim > 0:
            self.decoder = nn.Sequential(nn.Linear(latent_dim, decoder_hidden_dim), nn.ReLU(),
                                         nn.Linear(decoder_hidden_dim, 1))
        else:
            self.decoder = nn.Linear(latent_dim, 1)
        last = [m for m in self.decoder.modules() if isinstance(m, nn.Linear)][-1]
        nn.init.constant_(last.bias, init_logit_bias)
        if init == "cosine":
            self.start_at_cosine(BASELINE_LOGIT_SCALE, BASELINE_LOGIT_BIAS)

    @torch.no_grad()
    def start_at_cosine(self, logit_scale: float, logit_bias: float) -> None:
        """Set the weights so that the logit at z = mu is logit_scale * (v . t) + logit_bias for
        every pair (the "cosine" init, module docstring); the weights not named stay as they are."""
        plus_minus = torch.tensor([1.0, -1.0])  # units 0 and 1 hold relu(x) and relu(-x)
        gain = math.sqrt(self.embed_dim)  # unit-norm rows: +-gain * sum(s) / d = +-gain * cos
        self.fc1.weight[:2] = plus_minus[:, None] * (gain / self.embed_dim)  # (2, d)
        self.fc1.bias[:2] = 0.0
        k, latent = self.num_components, self.latent_dim
        # mu_k0 of every component (fc2 rows are [mu | logvar | alpha])
        mu_rows = torch.arange(k) * latent
        self.fc2.weight[mu_rows] = 0.0
        self.fc2.weight[mu_rows, :2] = plus_minus * (logit_scale / gain)  # mu_k0 = scale * cos
        self.fc2.bias[mu_rows] = 0.0
        linears = [m for m in self.decoder.modules() if isinstance(m, nn.Linear)]
        if len(linears) > 1:  # the same pair on z_0 in the decoder's hidden layer, gain 1
            hidden, out = linears
            hidden.weight[:2] = 0.0
            hidden.weight[:2, 0] = plus_minus
            hidden.bias[:2] = 0.0
            read = plus_minus  # (2,) output weights of the pair
        else:
            out, read = linears[0], torch.tensor([1.0])  # linear decoder reads z_0 itself
        out.weight.zero_()  # the other units start silent, as LoRA's second matrix
        out.weight[0, :read.numel()] = read
        out.bias.fill_(logit_bias)

    # ------------------------------------------------------------------ encoder
    def first_layer(self, image_feats: torch.Tensor, text_feats: torch.Tensor) -> torch.Tensor:
        """Pre-activation of the first layer for every pair, without materialising s.

        image_feats (B, d), text_feats (B', d) -> (B, B', H).
        """
        weight = self.fc1.weight  # (H, d)
        batch, dim = image_feats.shape
        hidden = weight.shape[0]
        scaled = image_feats[:, None, :] * (weight * self.scale)[None]  # (B, H, d)
        pre = scaled.reshape(batch * hidden, dim) @ text_feats.T  # (B*H, B')
        pre = pre.reshape(batch, hidden, -1).transpose(1, 2)  # (B, B', H)
        return pre + self.fc1.bias

    def encode_hidden(self, hidden: torch.Tensor):
        """(..., H) first-layer pre-activations -> mu, logvar (..., K, L) and alpha (..., K)."""
        out = self.fc2(F.relu(hidden))  # (..., K*(2L+1))
        k, latent = self.num_components, self.latent_dim
        mu, logvar, mix_logits = out.split([k * latent, k * latent, k], dim=-1)
        mu = mu.unflatten(-1, (k, latent))
        bound = self.logvar_bound  # smooth, keeps gradients: see module docstring
        logvar = bound * torch.tanh(logvar.unflatten(-1, (k, latent)) / bound)
        return mu, logvar, torch.softmax(mix_logits, dim=-1)

    def encode_pairs(self, similarity: torch.Tensor):
        """Explicit form on similarity vectors s (..., d): used by tests as the reference."""
        return self.encode_hidden(self.fc1(similarity))

    # ------------------------------------------------------------------ heads
    def uncertainty(self, logvar: torch.Tensor, mix_weights: torch.Tensor) -> torch.Tensor:
        """sigma_hat = sigmoid(sum_k alpha_k mean_l logvar_kl); exp(.) when not bounded
        ("w/o sigmoid" of Table 6)."""
        pooled = (mix_weights * logvar.mean(dim=-1)).sum(dim=-1)  # (...,)
        return torch.sigmoid(pooled) if self.bounded_sigma else torch.exp(pooled)

    def decode(self, z: torch.Tensor, mix_weights: torch.Tensor) -> torch.Tensor:
        """z (..., K, L), alpha (..., K) -> logit m = sum_k alpha_k dec(z_k), shape (...)."""
        per_component = self.decoder(z).squeeze(-1)  # (..., K)
        return (mix_weights * per_component).sum(dim=-1)

    def head(self, mu, logvar, mix_weights, sample: bool) -> AdapterOutput:
        if sample:
            eps = torch.randn_like(mu)  # one eps per component and latent dim
            z = mu + eps * torch.exp(0.5 * logvar)
        else:
            z = mu
        logits = self.decode(z, mix_weights)
        return AdapterOutput(logits=logits, sigma_hat=self.uncertainty(logvar, mix_weights),
                             mu=mu, logvar=logvar, mix_weights=mix_weights)

    def forward(self, image_feats: torch.Tensor, text_feats: torch.Tensor,
                sample: bool | None = None) -> AdapterOutput:
        """All pairs of image_feats (B, d) x text_feats (B', d); samples z in training mode."""
        sample = self.training if sample is None else sample
        mu, logvar, mix_weights = self.encode_hidden(self.first_layer(image_feats, text_feats))
        return self.head(mu, logvar, mix_weights, sample)

    @torch.no_grad()
    def score_block(self, queries: torch.Tensor, items: torch.Tensor):
        """Inference scores of a (N_q, N_g) block: (logits, sigma_hat), z = mu (no noise)."""
        mu, logvar, mix_weights = self.encode_hidden(self.first_layer(queries, items))
        return self.decode(mu, mix_weights), self.uncertainty(logvar, mix_weights)

    def min_log_sigma(self) -> float:
        """The smallest log sigma_hat the bounded logvar allows (the floor of L_sigma per pair)."""
        low = -self.logvar_bound
        return -math.log1p(math.exp(-low)) if self.bounded_sigma else low

    def flops_per_pair(self) -> int:
        """Multiply-adds x2 of one pair's score (first layer GEMM, second layer, decoder)."""
        hidden = self.fc1.weight.shape[0]
        k, latent = self.num_components, self.latent_dim
        flops = 2 * self.embed_dim * hidden + 2 * hidden * k * (2 * latent + 1)
        for layer in (m for m in self.decoder.modules() if isinstance(m, nn.Linear)):
            flops += 2 * k * layer.in_features * layer.out_features
        return flops


class SigmoidBaselineHead(nn.Module):
    """"w/o all components" of Table 6: SigLIP logits t * cos(v, t) + b, no adapter."""

    def __init__(self, *, init_logit_scale: float = math.log(BASELINE_LOGIT_SCALE),
                 init_logit_bias: float = BASELINE_LOGIT_BIAS):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor(init_logit_scale))
        self.logit_bias = nn.Parameter(torch.tensor(init_logit_bias))

    def forward(self, image_feats, text_feats, sample: bool | None = None) -> AdapterOutput:
        logits = self.logit_scale.exp() * image_feats @ text_feats.T + self.logit_bias  # (B, B')
        return AdapterOutput(logits=logits, sigma_hat=None)

    @torch.no_grad()
    def score_block(self, queries, items):
        return self.forward(queries, items).logits, None

    def flops_per_pair(self, embed_dim: int = 0) -> int:
        return 2 * embed_dim


def head_from_config(adapter: AdapterConfig, embed_dim: int) -> VariationalSimilarityAdapter:
    """The variational adapter with the fields of `adapter` (a config's `adapter` section) it
    takes; the section also holds other methods' keys (vacsr/methods/), which choose the head
    (`adapter.kind`: vacsr/methods/build.py)."""
    options = asdict(adapter)
    takes = inspect.signature(VariationalSimilarityAdapter.__init__).parameters
    return VariationalSimilarityAdapter(
        embed_dim=embed_dim, **{key: value for key, value in options.items()
                                if key in takes and key != "embed_dim"})
