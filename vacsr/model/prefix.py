"""A CLIP tower's forward pass split at a block: the frozen prefix, then the rest.

The paper trains "a few" blocks of each tower and searches "the number of frozen Transformer
layers" (appendix C.2). When the N trainable blocks are the last ones (`model.trainable_side:
last`), the embeddings and the blocks below them are frozen, so their output is a pure function
of the input: it runs without autograd in training, and on deterministic evaluation transforms it
is computed once and reused (vacsr/model/prefix_cache.py). How deep the prefix is follows one
rule (vacsr/model/frozen.py) that the backbone applies once (`ClipBackbone.frozen_depth`).
`prefix` gives that output, `suffix` the features from it; `suffix(prefix(x))` is the tower's
normalised feature, and `prefix_tensors` every parameter and buffer the prefix reads (what the
cache key digests).

What a prefix holds: the tokens after its last block, (B, L, W). When every block is frozen and
the pooling selects one token before a per-token head (a ViT's class token, the text's EOT
token), only that token: (B, 1, W), since a LayerNorm of one token does not see the others.
Only plain CLIP towers (open_clip's VisionTransformer without attention pooling, the built-in
text transformer) split; for others `split_supported` is False and nothing is cached.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from open_clip.transformer import PatchDropout, text_global_pool
from torch import nn

from vacsr.model.tower_hooks import run_blocks

TOWERS = ("image", "text")


def blocks(clip: nn.Module, tower: str) -> nn.ModuleList:
    if tower == "image":
        return clip.visual.transformer.resblocks
    text = clip.text if hasattr(clip, "text") else clip
    return text.transformer.resblocks


def _stem(clip: nn.Module, tower: str) -> list:
    """What a tower's prefix reads before its first block (modules, parameters and buffers)."""
    if tower == "image":
        visual = clip.visual
        return [visual.conv1, visual.class_embedding, visual.positional_embedding,
                visual.patch_dropout, visual.ln_pre]
    return [clip.token_embedding, clip.positional_embedding, clip.attn_mask]


def split_supported(backbone, tower: str) -> bool:
    """True for the towers this module can split (plain CLIP ViTs and text transformers)."""
    clip = backbone.clip
    if tower == "image":
        visual = clip.visual
        return (getattr(visual, "attn_pool", None) is None
                and not getattr(visual, "final_ln_after_pool", False)
                and getattr(visual, "pool_type", "tok") in ("tok", "avg")
                and hasattr(visual, "conv1"))
    return not hasattr(clip, "text") and hasattr(clip, "token_embedding")


def prefix_tensors(backbone, tower: str, depth: int) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter and buffer the prefix of `depth` blocks reads: the
    stem, then blocks 0 .. depth-1, in a fixed order."""
    clip = backbone.clip
    parts = [(f"stem.{i}", part) for i, part in enumerate(_stem(clip, tower))]
    parts += [(f"block.{i}", block) for i, block in enumerate(blocks(clip, tower)[:depth])]
    found = []
    for label, part in parts:
        if isinstance(part, torch.Tensor):
            found.append((label, part))
            continue
        found += [(f"{label}.{name}", value) for name, value in
                  [*part.named_parameters(), *part.named_buffers()]]
    return found


def constant_in_training(backbone, tower: str, depth: int) -> bool:
    """True when the prefix gives the same output in training mode too (no active dropout in
    it): a training pass may then reuse it for inputs it saw before (the class prompts)."""
    clip = backbone.clip
    parts = [p for p in _stem(clip, tower) if isinstance(p, nn.Module)]
    parts += list(blocks(clip, tower)[:depth])
    return not any(m.training and ((isinstance(m, nn.Dropout) and m.p > 0)
                                   or (isinstance(m, PatchDropout) and m.prob > 0))
                   for part in parts for m in part.modules())


def compact(backbone, tower: str, depth: int) -> bool:
    """True when the prefix keeps one token per input (see the module's docstring)."""
    if backbone.use_gpo or depth < len(blocks(backbone.clip, tower)):
        return False
    return tower == "text" or backbone.clip.visual.pool_type == "tok"


def _run_blocks(backbone, tower: str, transformer: nn.Module, x: torch.Tensor, start: int,
                stop: int, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """x (B, L, W) through blocks [start, stop) of an open_clip Transformer, with the hooks a
    deep method attached to the tower (vacsr/model/tower_hooks.py)."""
    return run_blocks(transformer.resblocks, x, start, stop,
                      batch_first=getattr(transformer, "batch_first", True), attn_mask=attn_mask,
                      hooks=getattr(backbone, "hooks", {}).get(tower))


def image_prefix(backbone, images: torch.Tensor, depth: int) -> torch.Tensor:
    """(B, 3, H, W) -> (B, L, W) tokens after `depth` blocks ((B, 1, W) when compact)."""
    visual = backbone.clip.visual
    x = visual.conv1(images)  # (B, W, g, g)
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)  # (B, g*g, W)
    cls = visual.class_embedding.to(x.dtype).view(1, 1, -1).expand(x.shape[0], -1, -1)
    x = torch.cat([cls, x], dim=1) + visual.positional_embedding.to(x.dtype)  # (B, L, W)
    x = visual.ln_pre(visual.patch_dropout(x))
    x = _run_blocks(backbone, "image", visual.transformer, x, 0, depth)
    return x[:, :1] if compact(backbone, "image", depth) else x


def image_suffix(backbone, prefix: torch.Tensor, depth: int) -> torch.Tensor:
    """image_prefix output -> (B, D) L2-normalised features (the tower's own head, or GPO)."""
    visual = backbone.clip.visual
    x = _run_blocks(backbone, "image", visual.transformer, prefix, depth,
                    len(visual.transformer.resblocks))
    x = visual.ln_post(x)  # per token, (B, L, W)
    if backbone.use_gpo:
        x = x @ visual.proj  # (B, L, D)
        lengths = torch.full((x.shape[0],), x.shape[1], device=x.device)
        return F.normalize(backbone.image_gpo(x, lengths), dim=-1)
    pooled = x[:, 1:].mean(dim=1) if visual.pool_type == "avg" else x[:, 0]  # (B, W)
    if visual.proj is not None:
        pooled = pooled @ visual.proj
    return F.normalize(pooled, dim=-1)


def text_mask(clip, length: int) -> torch.Tensor | None:
    """The text tower's attention mask for `length` positions: CLIP's causal mask cut to them
    (None for a tower without one)."""
    mask = clip.attn_mask
    if mask is None or mask.shape[-1] == length:
        return mask
    return mask[:length, :length]


def prompt_end(clip, tokens: torch.Tensor) -> int:
    """How many leading positions of (N, T) prompt ids their features read: through the longest
    prompt's EOT (the highest id in the vocabulary) in a causal tower that pools that token, as
    CLIP's does (Radford et al. 2021, sec. 2.4: masked self-attention, the [EOS] token's
    activations): under the mask no later position reaches it, so the features of the prompts
    cut there equal the whole context's. All T for any other tower."""
    if clip.attn_mask is None or getattr(clip, "text_pool_type", "argmax") != "argmax":
        return tokens.shape[1]
    return int(tokens.argmax(dim=-1).max()) + 1


def text_prefix(backbone, tokens: torch.Tensor, depth: int,
                embeddings: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) token ids -> (B, T, W) after `depth` blocks ((B, 1, W), the pooled token, when
    compact). `embeddings` (B, T, W): the token embeddings to start from instead of the ids'
    own (learned prompt context, vacsr/methods/coop.py); the ids still place the pooled token."""
    clip = backbone.clip
    cast = clip.transformer.get_cast_dtype()
    if embeddings is None:
        embeddings = clip.token_embedding(tokens)
    length = tokens.shape[1]  # CLIP's context, or fewer positions (prompt_end)
    x = embeddings.to(cast) + clip.positional_embedding[:length].to(cast)
    x = _run_blocks(backbone, "text", clip.transformer, x, 0, depth, text_mask(clip, length))
    if compact(backbone, "text", depth):
        return text_global_pool(x, tokens, clip.text_pool_type,
                                eos_token_id=getattr(clip, "text_eos_id", None))[:, None]
    return x


def text_head(backbone, x: torch.Tensor) -> torch.Tensor:
    """(..., W) -> (..., D): ln_final, then the text projection (a matrix or a Linear)."""
    clip = backbone.clip
    x = clip.ln_final(x)
    projection = clip.text_projection
    if projection is None:
        return x
    return projection(x) if isinstance(projection, nn.Linear) else x @ projection


def text_tokens(backbone, prefix: torch.Tensor, tokens: torch.Tensor,
                depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A non-compact text_prefix output -> (projected tokens (B, T, D), lengths (B,) from SOT to
    EOT): the blocks above the prefix, then the head on every token."""
    clip = backbone.clip
    x = _run_blocks(backbone, "text", clip.transformer, prefix, depth,
                    len(clip.transformer.resblocks), text_mask(clip, prefix.shape[1]))  # (B, T, W)
    return text_head(backbone, x), tokens.argmax(dim=-1) + 1  # EOT: the highest id in the vocab


def text_suffix(backbone, prefix: torch.Tensor, tokens: torch.Tensor,
                depth: int) -> torch.Tensor:
    """text_prefix output (and the token ids) -> (B, D) L2-normalised features."""
    clip = backbone.clip
    if compact(backbone, "text", depth):
        return F.normalize(text_head(backbone, prefix[:, 0]), dim=-1)
    if backbone.use_gpo:
        features, lengths = text_tokens(backbone, prefix, tokens, depth)  # (B, T, D), (B,)
        return F.normalize(backbone.text_gpo(features, lengths), dim=-1)
    x = _run_blocks(backbone, "text", clip.transformer, prefix, depth,
                    len(clip.transformer.resblocks), text_mask(clip, prefix.shape[1]))
    pooled = text_global_pool(x, tokens, clip.text_pool_type,
                              eos_token_id=getattr(clip, "text_eos_id", None))  # (B, W)
    return F.normalize(text_head(backbone, pooled), dim=-1)
