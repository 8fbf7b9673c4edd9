"""MMA's head (Yang et al., "MMA: Multi-Modal Adapter for Vision-Language Models", CVPR 2024,
sec. 3): at each of the highest blocks of both towers, an adapter whose two branches meet in one
shared projection,

    A_v(x) = U_v S D_v x,   A_t(x) = U_t S D_t x      (D: down to the shared width r, S: r x r
                                                       shared by both towers, U: back up)

added to the block's output tokens with a scale alpha: x <- x + alpha A(x). The shared S is what
lets the gradient of one tower's adapter reach the other's. CLIP stays frozen; the adapters act on
every image and every prompt, so classes never trained on are scored the same way, by CLIP's
exp(t) cos with its own temperature. At alpha = 0 it is zero-shot CLIP exactly.

The adapters reach the towers through the hooks of vacsr/model/tower_hooks.py, so the blocks
below the lowest adapter stay a frozen prefix whose output the prefix cache serves.
"""
from __future__ import annotations

from functools import partial

import torch
from torch import nn

from vacsr.model.clip_heads import CosineHead
from vacsr.model.tower_hooks import TowerHooks


class MultiModalAdapterHead(CosineHead):
    """exp(t) cos(v, w) of the adapted towers' features; the adapters, one per adapted block
    (`blocks[k]` of each tower), are this head's parameters."""

    def __init__(self, *, logit_scale: float, widths: dict[str, int],
                 blocks: dict[str, tuple[int, ...]], dim: int, scale: float) -> None:
        super().__init__(logit_scale=logit_scale)
        if len({len(b) for b in blocks.values()}) != 1:
            raise ValueError(f"MMA pairs the towers' adapted blocks one to one, got {blocks}")
        self.blocks, self.scale = dict(blocks), float(scale)
        levels = len(blocks["image"])
        self.down = nn.ModuleDict({t: nn.ModuleList(nn.Linear(w, dim) for _ in range(levels))
                                   for t, w in widths.items()})
        self.shared = nn.ModuleList(nn.Linear(dim, dim) for _ in range(levels))
        self.up = nn.ModuleDict({t: nn.ModuleList(nn.Linear(dim, w) for _ in range(levels))
                                 for t, w in widths.items()})

    def _adapt(self, tower: str, level: int, tokens: torch.Tensor) -> torch.Tensor:
        """x + alpha U S D x on a block's output tokens (B, L, W)."""
        shared = self.shared[level](self.down[tower][level](tokens))  # (B, L, r)
        return tokens + self.scale * self.up[tower][level](shared)  # (B, L, W)

    def tower_hooks(self) -> dict[str, TowerHooks]:
        return {tower: TowerHooks(after={block: partial(self._adapt, tower, level)
                                         for level, block in enumerate(blocks)})
                for tower, blocks in self.blocks.items()}
