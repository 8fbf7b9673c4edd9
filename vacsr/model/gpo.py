"""Generalized Pooling Operator (Chen et al. 2021, "Learning the best pooling strategy for visual
semantic embedding"), as the PCME++ retrieval recipe the paper follows uses it (appendix C.2).

Per feature dimension the valid tokens are sorted in descending order; a bidirectional GRU over
sinusoidal encodings of the sorted positions yields one weight per position (softmax of
score / 0.1), and the pooled feature is the weighted sum of the sorted values.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


def positional_encoding(lengths: torch.Tensor, max_len: int, dim: int) -> torch.Tensor:
    """Sinusoidal encodings of positions 0..len-1, zero beyond each length.

    lengths (B,) -> (B, max_len, dim).
    """
    position = torch.arange(max_len, device=lengths.device, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, device=lengths.device, dtype=torch.float32)
                     * (-math.log(10000.0) / dim))
    table = torch.zeros(max_len, dim, device=lengths.device)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)
    valid = torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]  # (B, T)
    return table[None] * valid[..., None]


class GPO(nn.Module):
    def __init__(self, *, pe_dim: int = 32, hidden_dim: int = 32, temperature: float = 0.1) -> None:
        super().__init__()
        self.pe_dim = pe_dim
        self.temperature = temperature
        self.gru = nn.GRU(pe_dim, hidden_dim, batch_first=True, bidirectional=True)
        self.score = nn.Linear(hidden_dim, 1, bias=False)

    def pooling_weights(self, lengths: torch.Tensor, max_len: int) -> torch.Tensor:
        """lengths (B,) -> softmax weights (B, max_len, 1), zero on padding."""
        encodings = positional_encoding(lengths, max_len, self.pe_dim)
        packed = pack_padded_sequence(encodings, lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        out, _ = self.gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=max_len)  # (B, T, 2h)
        half = out.shape[-1] // 2
        out = (out[..., :half] + out[..., half:]) / 2  # average of both directions
        scores = self.score(out)  # (B, T, 1)
        valid = torch.arange(max_len, device=lengths.device)[None, :, None] < lengths[:, None, None]
        scores = scores.masked_fill(~valid, float("-inf"))
        return torch.softmax(scores / self.temperature, dim=1)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """tokens (B, T, D), lengths (B,) -> pooled (B, D)."""
        batch, max_len, _ = tokens.shape
        valid = torch.arange(max_len, device=tokens.device)[None, :, None] < lengths[:, None, None]
        masked = tokens.masked_fill(~valid, float("-inf"))
        sorted_tokens = masked.sort(dim=1, descending=True).values  # per dimension
        sorted_tokens = sorted_tokens.masked_fill(~valid, 0.0)
        weights = self.pooling_weights(lengths, max_len).to(tokens.dtype)
        return (sorted_tokens * weights).sum(dim=1)
