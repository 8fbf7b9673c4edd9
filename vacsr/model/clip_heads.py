"""The heads of the methods that keep CLIP's own scoring (vacsr/methods/): exp(t) cos(v, w) with
CLIP's learned temperature t (Radford et al., 2021, sec. 2.3), frozen at the backbone's value, on
image features v and class features w that each method changes its own way:

- CosineHead: zero-shot CLIP, the prompts' features as they are;
- PrototypeHead: the linear probe of CLAP (ZS-LP), w_c = t_c + delta_c trained from delta = 0;
- ResidualAdapterHead: CLIP-Adapter's residual bottleneck MLP on v (its eq. 2-3);
- PromptContextHead: CoOp's learned context before the class name, through the frozen text tower.

Each is zero-shot CLIP exactly at its identity point (delta = 0, ratio 0, a context started at a
template's own words), which tests/unit/test_methods.py holds them to. ContrastiveHead is CLIP's
scoring with t trained, as in CLIP's own training (sec. 2.3), for its contrastive fine-tuning.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vacsr.model import prefix
from vacsr.model.adapter import AdapterOutput
from vacsr.model.prompt_room import RANDOM_INIT, check_room, phrase_ids


def clip_logit_scale(backbone) -> float:
    """log of CLIP's temperature scale (log 100 for OpenAI's weights)."""
    return float(backbone.clip.logit_scale.detach().float())


class CosineHead(nn.Module):
    """exp(t) cos(image, text) over a (B, B') block; subclasses change the image features
    (`image_side`) or the class features (`text_side`). No sigma_hat."""

    def __init__(self, *, logit_scale: float) -> None:
        super().__init__()
        # a buffer: saved with the checkpoint, never trained
        self.register_buffer("logit_scale", torch.tensor(float(logit_scale)))

    def image_side(self, image_feats: torch.Tensor) -> torch.Tensor:
        return image_feats

    def text_side(self, text_feats: torch.Tensor) -> torch.Tensor:
        return text_feats

    def forward(self, image_feats: torch.Tensor, text_feats: torch.Tensor,
                sample: bool | None = None) -> AdapterOutput:
        logits = cosine_logits(self.logit_scale, self.image_side(image_feats),
                               self.text_side(text_feats))
        return AdapterOutput(logits=logits, sigma_hat=None)

    @torch.no_grad()
    def score_block(self, queries: torch.Tensor, items: torch.Tensor):
        return self.forward(queries, items).logits, None


def cosine_logits(logit_scale: torch.Tensor, image_feats: torch.Tensor,
                  text_feats: torch.Tensor) -> torch.Tensor:
    """exp(t) cos(v, w) of every pair: (B, d) x (B', d) -> (B, B')."""
    image = F.normalize(image_feats, dim=-1)  # (B, d)
    text = F.normalize(text_feats, dim=-1)  # (B', d)
    return logit_scale.exp() * image @ text.T


def cross_entropy_loss(head: nn.Module, image_feats: torch.Tensor, text_feats: torch.Tensor,
                       labels: torch.Tensor, loss_config) -> tuple[torch.Tensor, dict]:
    """Cross-entropy of each image's class logits (CoOp eq. 2, CLIP-Adapter sec. 3.2, CLAP's
    linear probe): `labels` (B, C) one-hot rows of y_ij."""
    logits = head(image_feats, text_feats).logits  # (B, C)
    loss = F.cross_entropy(logits, labels.argmax(dim=1))
    return loss, {"ce": loss.detach()}


# CLIP clips its temperature so that it scales the logits by at most 100 (sec. 2.5)
MAX_LOGIT_SCALE = math.log(100.0)


class ContrastiveHead(nn.Module):
    """exp(t) cos(v, w) with CLIP's temperature t trained (Radford et al., 2021, sec. 2.3, Fig. 3):
    a log-scale parameter started at the backbone's logit_scale and clipped at log 100 (sec. 2.5).
    No sigma_hat."""

    def __init__(self, *, logit_scale: float) -> None:
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor(min(float(logit_scale), MAX_LOGIT_SCALE)))

    def forward(self, image_feats: torch.Tensor, text_feats: torch.Tensor,
                sample: bool | None = None) -> AdapterOutput:
        # CLIP clips t after each optimizer step (open_clip: clamp_ after the step); clipping the
        # parameter before each use gives every step the same value with no hook in the
        # trainer, and, unlike clipping only the value scored with, t at the bound still trains
        with torch.no_grad():
            self.logit_scale.clamp_(max=MAX_LOGIT_SCALE)
        return AdapterOutput(logits=cosine_logits(self.logit_scale, image_feats, text_feats),
                             sigma_hat=None)

    @torch.no_grad()
    def score_block(self, queries: torch.Tensor, items: torch.Tensor):
        return self.forward(queries, items).logits, None


def contrastive_loss(head: ContrastiveHead, image_feats: torch.Tensor, text_feats: torch.Tensor,
                     labels: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """CLIP's symmetric cross-entropy over the batch's similarity matrix (InfoNCE; Radford et al.,
    2021, sec. 2.3 and Fig. 3's pseudocode), on the logits l_ij = exp(t) cos(v_i, w_j):

        L = (L_i2t + L_t2i) / 2
        L_i2t = -1/B  sum_i sum_j q_ij log softmax_j(l_i.),  q_ij = y_ij / sum_j' y_ij'
        L_t2i = -1/B' sum_j sum_i p_ij log softmax_i(l_.j),  p_ij = y_ij / sum_i' y_i'j

    CLIP's batches hold one positive per row and column (labels = arange(n)); the (B, B') 0/1
    labels y of a retrieval batch may hold several (two pairs of one image drawn together: two
    of its captions, or a noisy pair's caption given to it), so the normalised positives are
    soft targets: CLIP's loss exactly where each row and column has one. Every row and column
    holds its own pair in a retrieval batch; one without a positive would add nothing."""
    logits = head(image_feats, text_feats).logits  # (B, B')
    labels = labels.to(logits.dtype)
    rows = labels / labels.sum(dim=1, keepdim=True).clamp_min(1.0)  # (B, B') q, rows sum to 1
    cols = labels / labels.sum(dim=0, keepdim=True).clamp_min(1.0)  # (B, B') p, columns sum to 1
    i2t = F.cross_entropy(logits, rows)  # over each row's captions
    t2i = F.cross_entropy(logits.T, cols.T)  # over each column's images
    loss = (i2t + t2i) / 2
    return loss, {"loss": loss.detach(), "infonce_i2t": i2t.detach(),
                  "infonce_t2i": t2i.detach(), "logit_scale": head.logit_scale.detach().clone()}


NAME_SEPARATOR = "\n"  # between the class names a PrototypeHead keeps (a name is one line)


class PrototypeHead(CosineHead):
    """exp(t) cos(v, t_c + delta_c); delta (C, d) is sized to the training classes (`fit_classes`)
    and, when a checkpoint is loaded, to the classes it holds. The head keeps its rows' class
    names (a uint8 buffer of their UTF-8 text, so the checkpoint carries them as a tensor), by
    which `prototypes_for` scores another class set; empty where a checkpoint predates them."""

    def __init__(self, *, logit_scale: float, embed_dim: int) -> None:
        super().__init__(logit_scale=logit_scale)
        self.delta = nn.Parameter(torch.zeros(0, embed_dim))  # (C, d) once fitted
        self.register_buffer("class_names", torch.zeros(0, dtype=torch.uint8))  # (bytes,)

    def fit_classes(self, classnames: Sequence[str]) -> None:
        """One zero residual per training class (before the optimizer is built), and the
        classes' names."""
        if any(NAME_SEPARATOR in name for name in classnames):
            raise ValueError("linear probe: a class name holds a line break; expected one line "
                             "per name")
        self.delta = nn.Parameter(self.delta.new_zeros(len(classnames), self.delta.shape[1]))
        text = NAME_SEPARATOR.join(classnames).encode()
        self.class_names = torch.tensor(list(text), dtype=torch.uint8,
                                        device=self.delta.device)

    def trained_names(self) -> list[str] | None:
        """The class names of delta's rows; None where the checkpoint did not record them."""
        if self.delta.shape[0] == 0 or self.class_names.numel() == 0:
            return None
        names = bytes(self.class_names.tolist()).decode().split(NAME_SEPARATOR)
        return names if len(names) == self.delta.shape[0] else None

    def text_side(self, text_feats: torch.Tensor) -> torch.Tensor:
        if text_feats.shape[0] != self.delta.shape[0]:
            raise ValueError(f"linear probe: {text_feats.shape[0]} class features for "
                             f"{self.delta.shape[0]} trained prototypes; classes it did not "
                             "train on are scored by unseen_head")
        return text_feats + self.delta  # (C, d)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        stored = state_dict.get(prefix + "delta")
        if stored is not None and stored.shape != self.delta.shape:  # the checkpoint's classes
            self.delta = nn.Parameter(self.delta.new_zeros(stored.shape))
        names = state_dict.get(prefix + "class_names")
        if names is not None and names.shape != self.class_names.shape:
            self.class_names = self.class_names.new_zeros(names.shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if names is None:  # written before the names were kept: no name is known
            self.class_names = self.class_names.new_zeros(0)
            if prefix + "class_names" in missing_keys:
                missing_keys.remove(prefix + "class_names")


def zero_shot_prototypes(head: PrototypeHead) -> CosineHead:
    """The head for classes it never trained on: their prompt features alone."""
    return CosineHead(logit_scale=float(head.logit_scale)).to(head.logit_scale.device)


def trained_rows(trained: Sequence[str], evaluated: Sequence[str]) -> list[int]:
    """Each evaluated class's row among the trained classes, by name; -1 for a class not trained
    on. A name several classes share matches in order only where it names as many evaluated
    classes as trained ones; otherwise which is which is unknown, and those are -1."""
    rows_of: dict[str, list[int]] = {}
    for row, name in enumerate(trained):
        rows_of.setdefault(name, []).append(row)
    count = Counter(evaluated)
    seen: Counter = Counter()
    found = []
    for name in evaluated:
        rows = rows_of.get(name, [])
        found.append(rows[seen[name]] if rows and len(rows) == count[name] else -1)
        seen[name] += 1
    return found


def prototypes_for(head: PrototypeHead, classnames: Sequence[str]) -> CosineHead:
    """The head scoring `classnames`, a class set other than the trained one (novel classes,
    ImageNet's classes on a shifted test set in another order or a subset): a class the head
    trained on, by name, keeps its prototype t_c + delta_c, any other its zero-shot prototype
    t_c. A head without recorded names scores them all zero-shot."""
    trained = head.trained_names()
    rows = torch.tensor(trained_rows(trained, classnames) if trained else [-1] * len(classnames),
                        dtype=torch.long)  # (C,)
    if not bool((rows >= 0).any()):
        return zero_shot_prototypes(head)
    scoring = PrototypeHead(logit_scale=float(head.logit_scale), embed_dim=head.delta.shape[1])
    scoring.fit_classes(classnames)
    known = rows >= 0
    with torch.no_grad():
        scoring.delta[known] = head.delta.detach().cpu()[rows[known]]  # (C_known, d)
    return scoring.to(head.logit_scale.device)


class ResidualAdapterHead(CosineHead):
    def __init__(self, *, logit_scale: float, embed_dim: int, reduction: int,
                 residual_ratio: float) -> None:
        super().__init__(logit_scale=logit_scale)
        hidden = max(1, embed_dim // reduction)
        # no biases, ReLU after both layers: the paper's eq. 2
        self.adapter = nn.Sequential(nn.Linear(embed_dim, hidden, bias=False), nn.ReLU(),
                                     nn.Linear(hidden, embed_dim, bias=False), nn.ReLU())
        self.residual_ratio = residual_ratio

    def image_side(self, image_feats: torch.Tensor) -> torch.Tensor:
        ratio = self.residual_ratio
        return ratio * self.adapter(image_feats) + (1.0 - ratio) * image_feats  # (B, d)


PLACEHOLDER = "X"  # one token of CLIP's BPE: its embeddings are replaced by the context
INIT_STD = 0.02  # CoOp's N(0, 0.02^2)


class PromptContextHead(CosineHead):
    """CLIP's scoring of prompts whose first M word embeddings are the learned `context`."""

    def __init__(self, *, logit_scale: float, context: torch.Tensor, words: str) -> None:
        super().__init__(logit_scale=logit_scale)
        self.context = nn.Parameter(context.detach().clone())  # (M, W)
        self.words = words  # the prompts' M words before the class name, replaced by `context`

    def encode_prompts(self, backbone, tokens: torch.Tensor) -> torch.Tensor:
        """(C, T) prompt ids, each "<SOT> M placeholders name. <EOT>" -> (C, D) normalised class
        features through the frozen text tower, with the gradient reaching the context."""
        return encode_with_context(backbone, tokens,
                                   self.context[None].expand(tokens.shape[0], -1, -1))


def encode_with_context(backbone, tokens: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """(N, T) prompt ids and (N, M, W) context vectors, one set per prompt -> (N, D) normalised
    features: each prompt's M word embeddings after <SOT> replaced by its context, through the
    whole frozen text tower (the gradient reaches the context), over the positions up to the
    longest prompt's end (prefix.prompt_end)."""
    clip = backbone.clip
    # the positions after the longest prompt's EOT change no feature: a prompt of M + a name's
    # tokens runs over ~15 of ViT-B/16's 77 (about 5x less text tower, forward and backward)
    tokens = tokens[:, :prefix.prompt_end(clip, tokens)]  # (N, T')
    words = clip.token_embedding(tokens)  # (N, T', W)
    context = context.to(words.dtype)
    embeddings = torch.cat([words[:, :1], context, words[:, 1 + context.shape[1]:]], dim=1)
    depth = len(prefix.blocks(clip, "text"))  # the whole tower, as its frozen path runs it
    hidden = prefix.text_prefix(backbone, tokens, depth, embeddings=embeddings)
    return prefix.text_suffix(backbone, hidden, tokens, depth)


def initial_context(adapter, backbone) -> torch.Tensor:
    """(M, W) context: a phrase's own token embeddings, or N(0, 0.02^2) draws. One line first, as
    the model is built (before a run writes anything), when M leaves no room for a class name."""
    check_room(adapter.context_tokens, adapter.context_init, backbone.name,
               int(backbone.clip.context_length))
    embedding = backbone.clip.token_embedding
    if adapter.context_init == RANDOM_INIT:
        return torch.randn(adapter.context_tokens, embedding.weight.shape[1]) * INIT_STD
    with torch.no_grad():
        return embedding(phrase_ids(backbone.tokenizer, adapter.context_init)).float()


def context_words(adapter) -> str:
    """The words the context replaces: M placeholders, or the init phrase itself (its tokens are
    the context's M positions)."""
    if adapter.context_init == RANDOM_INIT:
        return " ".join([PLACEHOLDER] * adapter.context_tokens)
    return adapter.context_init


def context_prompts(data, head: PromptContextHead) -> list[str]:
    """"<context words> <class name>." per class; the words' embeddings become the context."""
    return [f"{head.words} {name.replace('_', ' ')}." for name in data.classnames]
