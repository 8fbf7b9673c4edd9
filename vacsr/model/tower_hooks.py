"""What a deep method does inside a CLIP tower, block by block: one mechanism for the methods that
act between the blocks instead of around the tower.

Deep prompts put learned tokens into block j's input (MaPLe, Khattak et al., CVPR 2023, arXiv
2210.03117, sec. 3.2-3.3: language prompts in the first J text blocks, vision prompts coupled to
them); deep adapters add a residual to block j's output (MMA, Yang et al., CVPR 2024: adapters on
the higher blocks of both towers). A head that needs either gives the backbone a TowerHooks per
tower (`ClipBackbone.attach_hooks`): `before[j]` maps the tokens entering block j, `after[j]` the
tokens leaving it, each (B, L, W), batch first, whatever layout the tower runs in.

The blocks below the first hooked one are untouched, so they stay the tower's frozen prefix
(vacsr/model/frozen.py caps the prefix there) and the prefix cache keeps serving their output;
with no hook the tower is open_clip's. The text tower's causal mask fixes its length: a text
hook replaces tokens and never inserts them (refused in one line if it does).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

TokenMap = Callable[[torch.Tensor], torch.Tensor]  # (B, L, W) -> (B, L', W)


@dataclass(frozen=True)
class TowerHooks:
    """A tower's hooks: block index -> the map of the tokens entering (`before`) or leaving
    (`after`) that block."""

    before: Mapping[int, TokenMap] = field(default_factory=dict)
    after: Mapping[int, TokenMap] = field(default_factory=dict)

    @property
    def first_block(self) -> int | None:
        """The lowest block a hook touches (None: no hook): the prefix ends at or below it."""
        touched = [*self.before, *self.after]
        return min(touched) if touched else None

    def check(self, depth: int, tower: str) -> None:
        """Every hooked block exists in a tower of `depth` blocks."""
        outside = sorted(j for j in (*self.before, *self.after) if not 0 <= j < depth)
        if outside:
            raise ValueError(f"{tower} tower hooks at block(s) {outside}: the tower has "
                             f"blocks 0-{depth - 1}")


def run_blocks(resblocks, x: torch.Tensor, start: int, stop: int, *, batch_first: bool,
               attn_mask: torch.Tensor | None = None,
               hooks: TowerHooks | None = None) -> torch.Tensor:
    """x (B, L, W) through blocks [start, stop) of an open_clip Transformer's `resblocks`, each
    hook on its block's tokens (batch first)."""
    if start >= stop:
        return x
    if not batch_first:
        x = x.transpose(0, 1)  # (L, B, W)
    for j in range(start, stop):
        if hooks is not None and j in hooks.before:
            x = _hooked(hooks.before[j], x, batch_first, attn_mask)
        x = resblocks[j](x, attn_mask=attn_mask)
        if hooks is not None and j in hooks.after:
            x = _hooked(hooks.after[j], x, batch_first, attn_mask)
    return x if batch_first else x.transpose(0, 1)


def _hooked(apply: TokenMap, x: torch.Tensor, batch_first: bool,
            attn_mask: torch.Tensor | None) -> torch.Tensor:
    tokens = apply(x if batch_first else x.transpose(0, 1))  # (B, L', W)
    if attn_mask is not None and tokens.shape[1] != attn_mask.shape[-1]:
        raise ValueError(f"a text tower hook gave {tokens.shape[1]} tokens; the causal mask "
                         f"holds {attn_mask.shape[-1]}: text hooks replace tokens, never insert")
    return tokens if batch_first else tokens.transpose(0, 1)
