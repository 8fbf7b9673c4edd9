"""MaPLe's head (Khattak et al., "MaPLe: Multi-modal Prompt Learning", CVPR 2023, arXiv
2210.03117, sec. 3.2-3.3): learned language prompts P_k (M x text width) in the first J blocks of
the text tower, and vision prompts obtained from them through a coupling function per block,

    P~_k = F_k(P_k)   (F_k: a linear layer, text width -> image width)

so that both towers' prompts learn together instead of apart. P_0 is CoOp's context: it takes the
place of the first M word embeddings of "<context> <class>." (started at a phrase's own words, or
N(0, 0.02^2)). For k = 1 .. J-1, block k's input takes P_k at those M text positions, and P~_k in
place of the M vision prompt tokens. P~_0 is appended to the image tokens at the input of block 0
(after the patch and class tokens, through the tower's ln_pre as each token is); above block J-1
the prompts' tokens go on as the blocks made them. CLIP stays frozen; it is scored as CLIP
scores, exp(t) cos, with the class token's feature (a ViT pooling its class token).

With J = 1 and no vision prompts it is CoOp with the same context exactly
(tests/unit/test_methods.py).
"""
from __future__ import annotations

from functools import partial

import torch
from torch import nn

from vacsr.model.clip_heads import INIT_STD, PromptContextHead
from vacsr.model.tower_hooks import TowerHooks


class MultiModalPromptHead(PromptContextHead):
    """CoOp's context P_0 in the prompts, deep language prompts P_1 .. P_{J-1} and the coupling
    functions F_0 .. F_{J-1}; `ln_pre`: the image tower's (its tokens' norm before block 0),
    applied to the vision prompts appended there and never trained."""

    def __init__(self, *, logit_scale: float, context: torch.Tensor, words: str, depth: int,
                 image_width: int, ln_pre: nn.Module | None, couple: bool = True) -> None:
        super().__init__(logit_scale=logit_scale, context=context, words=words)
        count, text_width = context.shape
        self.depth = int(depth)
        self.deep_prompts = nn.ParameterList(
            nn.Parameter(torch.randn(count, text_width) * INIT_STD) for _ in range(depth - 1))
        self.couplings = nn.ModuleList(nn.Linear(text_width, image_width)
                                       for _ in range(depth if couple else 0))
        self._ln_pre = (ln_pre if ln_pre is not None else nn.Identity(),)  # not this head's

    def language_prompt(self, level: int) -> torch.Tensor:
        """P_level: (M, text width)."""
        return self.context if level == 0 else self.deep_prompts[level - 1]

    def _text_tokens(self, level: int, x: torch.Tensor) -> torch.Tensor:
        """Block `level`'s input (B, T, W_t): P_level at the context's M positions."""
        prompt = self.language_prompt(level).to(x.dtype)[None].expand(x.shape[0], -1, -1)
        return torch.cat([x[:, :1], prompt, x[:, 1 + prompt.shape[1]:]], dim=1)

    def _vision_prompt(self, level: int, x: torch.Tensor) -> torch.Tensor:
        """P~_level = F_level(P_level) for a batch like x: (B, M, W_v)."""
        prompt = self.couplings[level](self.language_prompt(level).to(x.dtype))  # (M, W_v)
        return prompt[None].expand(x.shape[0], -1, -1)

    def _append_vision(self, x: torch.Tensor) -> torch.Tensor:
        """Block 0's input (B, 1 + N, W_v) -> (B, 1 + N + M, W_v)."""
        return torch.cat([x, self._ln_pre[0](self._vision_prompt(0, x))], dim=1)

    def _replace_vision(self, level: int, x: torch.Tensor) -> torch.Tensor:
        """Block `level`'s input: its last M tokens (the prompts) replaced by P~_level."""
        prompt = self._vision_prompt(level, x)
        return torch.cat([x[:, :-prompt.shape[1]], prompt], dim=1)

    def tower_hooks(self) -> dict[str, TowerHooks]:
        deeper = range(1, self.depth)
        text = TowerHooks(before={k: partial(self._text_tokens, k) for k in deeper})
        if not len(self.couplings):
            return {"text": text}
        image = TowerHooks(before={0: self._append_vision,
                                   **{k: partial(self._replace_vision, k) for k in deeper}})
        return {"image": image, "text": text}
