"""Peak memory of one training step, estimated from the model config alone (no GPU needed).

Sizes a run at the paper's scale (arXiv 2605.30968: ViT-B/16 and /32, batch 128, bf16) before a GPU
is at hand, and gives the GPU check a figure to hold torch.cuda.max_memory_allocated against.
P = all parameters, P_t = trainable ones, s = activation bytes (bf16 2, fp32 4), r = residual-stream
bytes (4: bf16 autocast keeps the residual adds in fp32), B images, B' texts, T tokens, D width:

    weights      4 P                           fp32 master weights (autocast keeps them fp32)
    optimizer    (4 + 8) P_t                   fp32 gradient + AdamP's exp_avg and exp_avg_sq
    casts        2 P_path (bf16 only)          autocast's bf16 copies of the block weights on the
                                               gradient path, saved for the backward pass
    activations  per block on the path:        B T D ((c - 2) s + 2 r) + a B heads T^2 s
                 + per tower B T (D (r + s) + E (8 + 2 s))  final LayerNorm, GPO sort (T = 1 pooled)
    adapter      4 (B H d + 3 B B' H)          the (B, H, d) scaled first-layer weight, (B, B', H)
                                               pre-activations, ReLU and fc2 inputs
    inputs       4 B 3 S^2 + 8 B' T_text       images and token ids

c counts the (B, T, D) tensors a block saves. A trainable block: c = 16 (input, LN-1 out, q, k, v,
attention out, LN-2 in and out, MLP hidden before and after GELU: 4 + 4), two of them (the LayerNorm
inputs) residual stream. With the first N blocks training (model.trainable_side first) the
gradient reaches them through every later block; those frozen blocks save c = 10 (a frozen linear
needs no input: input, LN-2 in, q k v, attention out, GELU input). With the last N training the
frozen prefix below them runs without autograd and saves nothing: activations are kept only from
the first trainable block up. N = 0 saves no block activations (the whole tower is the frozen
prefix), unless the embeddings train (vacsr/model/frozen.py: the backbone's own rule). a = 0 with
fused attention (scaled_dot_product_attention keeps a (B, heads, T) log-sum-exp), 1 with the math
kernel. These match torch's saved tensors within a few percent (tests/unit/test_memory.py).
Gradients and activations count as live together; backward-pass transients and allocator slack
are not counted.
"""
from __future__ import annotations

from dataclasses import dataclass

from vacsr.config import AdapterConfig
from vacsr.model.configs import model_config
from vacsr.model.frozen import gradient_blocks

C_TRAINABLE, C_FROZEN = 16, 10  # saved (B, T, D) tensors per block, see the module docstring
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
GPO_PE_DIM, GPO_HIDDEN = 32, 32  # GPO()'s defaults (vacsr/model/gpo.py), as the model builds it


@dataclass(frozen=True)
class Tower:
    """A transformer tower; tokens and input bytes are per sample, other_params outside blocks."""

    layers: int
    width: int
    heads: int
    tokens: int
    input_bytes: int
    other_params: int

    def block_params(self) -> int:
        """ln_1, attention (in_proj, out_proj), ln_2, MLP (ratio 4): 12 W^2 + 13 W."""
        return 12 * self.width ** 2 + 13 * self.width

    def params(self) -> int:
        return self.layers * self.block_params() + self.other_params


def towers(name: str) -> tuple[Tower, Tower, int]:
    """(image tower, text tower, embed dim) of an open_clip ViT config, from its JSON alone
    (read as a file: open_clip is imported only for a name it alone resolves, such as hf-hub:)."""
    cfg = model_config(name)
    if cfg is None:
        import open_clip

        from vacsr.model.backbone import register_model_configs

        register_model_configs()
        cfg = open_clip.get_model_config(name)
    if cfg is None:
        raise ValueError(f"unknown open_clip model {name!r}")
    v, t, embed = cfg["vision_cfg"], cfg["text_cfg"], int(cfg["embed_dim"])
    width, patch, size = v["width"], v["patch_size"], v["image_size"]
    tokens = (size // patch) ** 2 + 1  # patches + class token
    # conv1 (no bias), class token, positional, ln_pre + ln_post, proj
    image_other = 3 * patch ** 2 * width + width + tokens * width + 4 * width + width * embed
    image = Tower(v["layers"], width, width // v.get("head_width", 64), tokens, 4 * 3 * size ** 2,
                  image_other)
    ctx, tw = t["context_length"], t["width"]
    # token and positional embeddings, ln_final, text_projection, logit_scale
    text_other = t["vocab_size"] * tw + ctx * tw + 2 * tw + tw * embed + 1
    return image, Tower(t["layers"], tw, t["heads"], ctx, 8 * ctx, text_other), embed


def adapter_params(embed: int, hidden: int, adapter: AdapterConfig | None = None) -> int:
    """Parameters of VariationalSimilarityAdapter(embed_dim=embed, hidden_dim=hidden) with the
    other sizes of `adapter` (default: the adapter's own defaults; vacsr/model/adapter.py): fc1
    d -> H, fc2 H -> K (2L + 1), the decoder L -> D_h -> 1 (L -> 1 without a hidden layer); each
    Linear with its bias."""
    adapter = adapter or AdapterConfig()
    k, latent, dec = adapter.num_components, adapter.latent_dim, adapter.decoder_hidden_dim
    decoder = (latent + 1) * dec + dec + 1 if dec > 0 else latent + 1
    return (embed + 1) * hidden + (hidden + 1) * k * (2 * latent + 1) + decoder


def gpo_params(pe_dim: int = GPO_PE_DIM, hidden: int = GPO_HIDDEN) -> int:
    """Parameters of a GPO: a bidirectional one-layer GRU (per direction three gates, each an
    input and a hidden weight and two biases) and the bias-free score layer."""
    return 2 * 3 * hidden * (pe_dim + hidden + 2) + hidden


def _tower(tower: Tower, blocks: int, rows: int, s: int, r: int, fused: bool, embed: int,
           pooled_tokens: int, side: str = "first", embeddings: bool = False,
           hooked: int = 0) -> tuple[int, int, int]:
    """(trainable block params, activation bytes, bf16-cast bytes) of one tower; `hooked`: the
    blocks from a deep method's lowest hook to the top (vacsr/model/tower_hooks.py)."""
    n = tower.layers if blocks == -1 else min(blocks, tower.layers)
    # blocks the gradient crosses: all above the frozen prefix (vacsr/model/frozen.py)
    path = gradient_blocks(side, blocks, tower.layers, embeddings_trainable=embeddings,
                           first_hook=tower.layers - hooked if hooked else None)
    btd = rows * tower.tokens * tower.width
    attention = 0 if fused else rows * tower.heads * tower.tokens ** 2 * s
    trainable_block = btd * ((C_TRAINABLE - 2) * s + 2 * r) + attention
    frozen_block = btd * ((C_FROZEN - 2) * s + 2 * r) + attention
    tail = rows * pooled_tokens * (tower.width * (r + s) + embed * (8 + 2 * s))
    casts = 2 * path * tower.block_params() if s == 2 else 0
    return n * tower.block_params(), n * trainable_block + (path - n) * frozen_block + tail, casts


def estimate_step_memory(name: str = "ViT-B-16", *, batch_size: int = 128, dtype: str = "bf16",
                         image_blocks: int = -1, text_blocks: int = -1,
                         train_projections: bool = True, use_gpo: bool = True,
                         adapter_hidden: int = 512, texts: int | None = None,
                         fused_attention: bool = True, side: str = "first",
                         train_embeddings: bool = False,
                         hooked: tuple[int, int] = (0, 0)) -> dict[str, int]:
    """Bytes of each term of the module docstring, and their "total", for a retrieval step of
    `batch_size` images and `texts` captions (default: as many; classification: the classes);
    `side`: which end of each tower trains (model.trainable_side); `train_embeddings`: the
    embeddings train (the gradient then crosses every block); `hooked`: a deep method's blocks
    from its lowest hook to the top of the image and the text tower (their activations kept for
    the gradient)."""
    image, text, embed = towers(name)
    s, r = DTYPE_BYTES[dtype], 4
    texts = batch_size if texts is None else texts
    # adapter and GPO: always trained
    new = adapter_params(embed, adapter_hidden) + (2 * gpo_params() if use_gpo else 0)
    trainable, activations, casts = new, 0, 0
    if train_projections:
        trainable += 2 * image.width + image.width * embed + 2 * text.width + text.width * embed
    for tower, blocks, rows, hooks in ((image, image_blocks, batch_size, hooked[0]),
                                       (text, text_blocks, texts, hooked[1])):
        params, acts, cast = _tower(tower, blocks, rows, s, r, fused_attention, embed,
                                    tower.tokens if use_gpo else 1, side, train_embeddings,
                                    hooks)
        trainable, activations, casts = trainable + params, activations + acts, casts + cast
    parts = {
        "weights": 4 * (image.params() + text.params() + new),
        "optimizer": 12 * trainable,
        "casts": casts,
        "activations": activations,
        "adapter": 4 * batch_size * adapter_hidden * (embed + 3 * texts),
        "inputs": batch_size * image.input_bytes + texts * text.input_bytes,
    }
    parts["total"] = sum(parts.values())
    return parts


def estimate_for_config(config, dtype: str | None = None, texts: int | None = None,
                        hooked: tuple[int, int] = (0, 0)) -> dict[str, int]:
    """estimate_step_memory of a vacsr Config's worker (its share of the batch); dtype: bf16
    when train.amp, else fp32; texts: per step (default: as many as images); `hooked`: its
    method's (vacsr/methods/method.py Method.hooked_blocks)."""
    m = config.model
    rows = config.train.batch_size // max(config.train.workers, 1)
    return estimate_step_memory(
        m.name, batch_size=rows, use_gpo=m.use_gpo, side=m.trainable_side, texts=texts,
        dtype=dtype or ("bf16" if config.train.amp else "fp32"),
        image_blocks=m.trainable_image_blocks, text_blocks=m.trainable_text_blocks,
        train_projections=m.train_projections, adapter_hidden=config.adapter.hidden_dim,
        train_embeddings=m.train_embeddings, hooked=hooked)
