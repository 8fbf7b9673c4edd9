"""open_clip backbone: model creation, token- and pooled-level features, N trainable blocks at
the first or the last end of each tower.

Weights come from an open_clip pretrained tag or a local file the user names; `pretrained=None`
builds a randomly initialised model (tests, demo). Nothing here downloads unless a tag is given.
"""
from __future__ import annotations

from contextlib import nullcontext
from functools import lru_cache
from pathlib import Path

import open_clip
import torch
import torch.nn.functional as F
from torch import nn

from vacsr.errors import ConfigError
from vacsr.model import prefix
from vacsr.model.configs import MODEL_CONFIG_DIR
from vacsr.model.frozen import frozen_blocks
from vacsr.model.gpo import GPO
from vacsr.model.tower_hooks import TowerHooks
from vacsr.model.weights import create_with_weights


def register_model_configs() -> None:
    """Add vacsr's own configs (the tiny test model) to open_clip's registry, once."""
    if "vacsr-tiny" not in open_clip.list_models():
        open_clip.add_model_config(MODEL_CONFIG_DIR)


@lru_cache(maxsize=None)
def model_tokenizer(name: str):
    """open_clip's tokenizer of model `name`: the backbone's, and the one a sweep's plan counts
    prompt tokens with before any model is built (vacsr/model/prompt_room.py)."""
    register_model_configs()
    return open_clip.get_tokenizer(name)


def _resolve_pretrained(name: str, pretrained: str | None) -> str | None:
    if pretrained is None or pretrained == "":
        return None
    if Path(pretrained).expanduser().is_file():
        return str(Path(pretrained).expanduser().resolve())
    tags = open_clip.list_pretrained_tags_by_model(name)
    if pretrained not in tags:
        raise ConfigError(f"model.pretrained: {pretrained!r} is neither a local weights file "
                          f"nor an open_clip tag of {name} (tags: {', '.join(tags) or 'none'})")
    return pretrained


def create_clip(name: str, pretrained: str | None = None):
    """(model, train_transform, eval_transform, tokenizer) from open_clip, with clear errors."""
    register_model_configs()
    if name not in open_clip.list_models() and not name.startswith("hf-hub:"):
        raise ConfigError(f"model.name: unknown open_clip model {name!r}")
    resolved = _resolve_pretrained(name, pretrained)
    if resolved is not None and Path(resolved).is_file():  # the one loader of weights files
        model, train_transform, eval_transform = create_with_weights(name, resolved)
    else:
        model, train_transform, eval_transform = open_clip.create_model_and_transforms(
            name, pretrained=resolved)
    return model, train_transform, eval_transform, model_tokenizer(name)


def trainable_slice(count: int, depth: int, side: str) -> slice:
    """The blocks that train: all (-1), the first `count` or the last `count` of `depth`."""
    if count == -1:
        return slice(0, depth)
    return slice(0, count) if side == "first" else slice(depth - count, depth)


def set_trainable(model: nn.Module, *, image_blocks: int, text_blocks: int,
                  projections: bool, embeddings: bool, side: str = "first") -> None:
    """Freeze everything, then unfreeze N blocks of each tower (-1 = all blocks), the first N
    or the last N (`side`)."""
    if side not in ("first", "last"):
        raise ConfigError(f"model.trainable_side: expected one of first, last, got {side!r}")
    model.requires_grad_(False)
    for tower, count in (("image", image_blocks), ("text", text_blocks)):
        tower_blocks = prefix.blocks(model, tower)
        if count > len(tower_blocks):
            raise ConfigError(f"model.trainable_{tower}_blocks: {count} exceeds the "
                              f"{len(tower_blocks)} blocks of the {tower} tower")
        for block in tower_blocks[trainable_slice(count, len(tower_blocks), side)]:
            block.requires_grad_(True)
    text = model.text if hasattr(model, "text") else model
    if projections:
        for part in (model.visual.ln_post, getattr(text, "ln_final", None)):
            if part is not None:
                part.requires_grad_(True)
        for param in (model.visual.proj, getattr(text, "text_projection", None)):
            if isinstance(param, nn.Parameter):
                param.requires_grad_(True)
            elif isinstance(param, nn.Module):
                param.requires_grad_(True)
    if embeddings:
        for part in (model.visual.conv1, model.visual.ln_pre, text.token_embedding):
            part.requires_grad_(True)
        for param in (model.visual.class_embedding, model.visual.positional_embedding,
                      text.positional_embedding):
            param.requires_grad_(True)


class ClipBackbone(nn.Module):
    """Image and text encoders giving L2-normalised d-dim features (pooled, or tokens + GPO)."""

    def __init__(self, *, name: str = "vacsr-tiny", pretrained: str | None = None,
                 use_gpo: bool = True, trainable_image_blocks: int = -1,
                 trainable_text_blocks: int = -1, train_projections: bool = True,
                 train_embeddings: bool = False, trainable_side: str = "first") -> None:
        super().__init__()
        clip, self.train_transform, self.eval_transform, self.tokenizer = create_clip(
            name, pretrained)
        if use_gpo and (hasattr(clip, "text") or clip.visual.attn_pool is not None
                        or getattr(clip.visual, "final_ln_after_pool", False)):
            raise ConfigError(f"model.use_gpo: token outputs are supported for plain CLIP ViTs, "
                              f"not {name}; set model.use_gpo=false")
        self.clip = clip
        self.name = name
        self.use_gpo = use_gpo
        self.embed_dim = int(clip.visual.output_dim)
        self.trainable_side = trainable_side
        set_trainable(clip, image_blocks=trainable_image_blocks, text_blocks=trainable_text_blocks,
                      projections=train_projections, embeddings=train_embeddings,
                      side=trainable_side)
        self._trainable_blocks = {"image": trainable_image_blocks, "text": trainable_text_blocks}
        self._train_embeddings = train_embeddings
        self.hooks: dict[str, TowerHooks] = {}  # a deep method's, per tower (attach_hooks)
        self._decide_frozen_depths()
        if use_gpo:
            self.image_gpo, self.text_gpo = GPO(), GPO()

    def _decide_frozen_depths(self) -> None:
        """The one place each tower's frozen prefix is decided (vacsr/model/frozen.py): training,
        evaluation passes, the prefix cache and the estimates all read it from here."""
        self.frozen_depths = {
            tower: frozen_blocks(self.trainable_side, self._trainable_blocks[tower],
                                 len(prefix.blocks(self.clip, tower)),
                                 embeddings_trainable=self._train_embeddings,
                                 split_supported=prefix.split_supported(self, tower),
                                 first_hook=self.hooks[tower].first_block
                                 if tower in self.hooks else None)
            for tower in prefix.TOWERS}

    def attach_hooks(self, hooks: dict[str, TowerHooks]) -> None:
        """A deep method's hooks per tower (vacsr/model/tower_hooks.py): from now on each tower
        runs them, its frozen prefix ending at or below its first hooked block."""
        for tower, found in hooks.items():
            if found.first_block is not None and not prefix.split_supported(self, tower):
                raise ConfigError(f"model.name: {self.name}'s {tower} tower cannot run a deep "
                                  "method's hooks (plain CLIP ViTs and text transformers can)")
            found.check(len(prefix.blocks(self.clip, tower)), tower)
        self.hooks = {tower: found for tower, found in hooks.items() if found.first_block
                      is not None}
        self._decide_frozen_depths()

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        return self.tokenizer(texts)

    def frozen_depth(self, tower: str) -> int:
        """Leading blocks of `tower` that form its frozen prefix (0: none): run without autograd
        in every forward, cached by evaluation passes. With no trainable block the whole tower
        is the prefix, on either side; with side first and N >= 1 there is none, and the tower
        runs as open_clip runs it."""
        return self.frozen_depths[tower]

    def image_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """All projected image tokens, class token included: (B, 1 + N, D)."""
        visual = self.clip.visual
        # open_clip's public feature API: the last block's tokens, after ln_post
        out = visual.forward_intermediates(images, indices=1, normalize_intermediates=True,
                                           intermediates_only=True, output_fmt="NLC",
                                           output_extra_tokens=True)
        x = torch.cat([out["image_intermediates_prefix"][0],  # (B, 1, W) class token
                       out["image_intermediates"][0]], dim=1)  # (B, N, W) patch tokens
        return x @ visual.proj  # (B, 1+N, D)

    def text_tokens(self, tokens: torch.Tensor):
        """Projected text tokens from SOT to EOT: ((B, T, D), lengths (B,))."""
        return prefix.text_tokens(self, prefix.text_prefix(self, tokens, 0), tokens, 0)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, D), L2-normalised."""
        depth = self.frozen_depth("image")
        if depth or "image" in self.hooks:  # split where the prefix ends, or to run the hooks
            with torch.no_grad() if depth else nullcontext():  # a prefix keeps no activations
                tokens = prefix.image_prefix(self, images, depth)
            return prefix.image_suffix(self, tokens, depth)
        if not self.use_gpo:
            return self.clip.encode_image(images, normalize=True)
        tokens = self.image_tokens(images)
        lengths = torch.full((tokens.shape[0],), tokens.shape[1], device=tokens.device)
        return F.normalize(self.image_gpo(tokens, lengths), dim=-1)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, D), L2-normalised."""
        depth = self.frozen_depth("text")
        if depth or "text" in self.hooks:
            with torch.no_grad() if depth else nullcontext():
                hidden = prefix.text_prefix(self, tokens, depth)
            return prefix.text_suffix(self, hidden, tokens, depth)
        if not self.use_gpo:
            return self.clip.encode_text(tokens, normalize=True)
        return prefix.text_suffix(self, prefix.text_prefix(self, tokens, 0), tokens, 0)


def build_backbone(config) -> ClipBackbone:
    """ModelConfig -> ClipBackbone."""
    return ClipBackbone(name=config.name, pretrained=config.pretrained, use_gpo=config.use_gpo,
                        trainable_image_blocks=config.trainable_image_blocks,
                        trainable_text_blocks=config.trainable_text_blocks,
                        train_projections=config.train_projections,
                        train_embeddings=config.train_embeddings,
                        trainable_side=config.trainable_side)
