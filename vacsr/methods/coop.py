"""CoOp (Zhou et al., IJCV 2022, arXiv 2109.01134, sec. 3.2): M learned context vectors take the
place of a prompt's words before the class name, "[V]_1 ... [V]_M [CLASS]." (class token at the
end), and go through the frozen text tower; only the context trains, with cross-entropy on CLIP's
scoring (eq. 2). The context is one for all classes (unified), so a class never trained on is
scored by its own name after the same learned context.

Its init (`adapter.context_init`): "random" draws M = `adapter.context_tokens` vectors from
N(0, 0.02^2) (the paper's init); a phrase ("a photo of a") starts the context at that phrase's own
token embeddings, M its token count, so before the first step CoOp is zero-shot CLIP with the
template "<phrase> {}." exactly.
"""
from __future__ import annotations

import torch
from torch import nn

from vacsr.config.domains import Choice
from vacsr.errors import ConfigError
from vacsr.methods.cosine import CosineHead, clip_logit_scale, cross_entropy_loss
from vacsr.methods.method import FROZEN_CLIP, SHARED_KEYS, Method
from vacsr.model import prefix

PLACEHOLDER = "X"  # one token of CLIP's BPE: its embeddings are replaced by the context
RANDOM_INIT = "random"
INIT_STD = 0.02  # CoOp's N(0, 0.02^2)


def phrase_tokens(backbone, phrase: str) -> torch.Tensor:
    """The token ids of `phrase` between its start and end tokens: (M,)."""
    ids = backbone.tokenize([phrase])[0]  # (T,)
    end = int(ids.argmax())  # EOT: the highest id in the vocabulary
    return ids[1:end]


class PromptContextHead(CosineHead):
    """CLIP's scoring of prompts whose first M word embeddings are the learned `context`."""

    def __init__(self, *, logit_scale: float, context: torch.Tensor, words: str) -> None:
        super().__init__(logit_scale=logit_scale)
        self.context = nn.Parameter(context.detach().clone())  # (M, W)
        self.words = words  # the prompts' M words before the class name, replaced by `context`

    def encode_prompts(self, backbone, tokens: torch.Tensor) -> torch.Tensor:
        """(C, T) prompt ids, each "<SOT> M placeholders name. <EOT>" -> (C, D) normalised class
        features through the frozen text tower, with the gradient reaching the context."""
        clip = backbone.clip
        words = clip.token_embedding(tokens)  # (C, T, W)
        context = self.context.to(words.dtype)[None].expand(tokens.shape[0], -1, -1)
        embeddings = torch.cat([words[:, :1], context, words[:, 1 + context.shape[1]:]], dim=1)
        depth = len(prefix.blocks(clip, "text"))  # the whole tower, as its frozen path runs it
        hidden = prefix.text_prefix(backbone, tokens, depth, embeddings=embeddings)
        return prefix.text_suffix(backbone, hidden, tokens, depth)


def initial_context(adapter, backbone) -> torch.Tensor:
    """(M, W) context: a phrase's own token embeddings, or N(0, 0.02^2) draws."""
    embedding = backbone.clip.token_embedding
    if adapter.context_init == RANDOM_INIT:
        context = torch.randn(adapter.context_tokens, embedding.weight.shape[1]) * INIT_STD
    else:
        with torch.no_grad():
            context = embedding(phrase_tokens(backbone, adapter.context_init)).float()
    check_room(adapter, backbone, context.shape[0])
    return context


def check_room(adapter, backbone, m: int) -> None:
    """One line, as the model is built (before a run writes anything), when M context tokens
    leave no room for a class name: <SOT>, the context, a word of the name, <EOT>."""
    positions = int(backbone.clip.context_length)
    if m + 3 <= positions:
        return
    if adapter.context_init == RANDOM_INIT:
        raise ConfigError(f"adapter.context_tokens: {m} context tokens leave no room for a class "
                          f"name in {backbone.name}'s {positions} text positions; expected at "
                          f"most {positions - 3}")
    raise ConfigError(f"adapter.context_init: {adapter.context_init!r} is {m} tokens, which leave "
                      f"no room for a class name in {backbone.name}'s {positions} text "
                      f"positions; expected a phrase of at most {positions - 3} tokens")


def context_words(adapter) -> str:
    """The words the context replaces: M placeholders, or the init phrase itself (its tokens are
    the context's M positions)."""
    if adapter.context_init == RANDOM_INIT:
        return " ".join([PLACEHOLDER] * adapter.context_tokens)
    return adapter.context_init


def build_head(adapter, backbone) -> PromptContextHead:
    return PromptContextHead(logit_scale=clip_logit_scale(backbone),
                             context=initial_context(adapter, backbone),
                             words=context_words(adapter))


def prompts(data, head: PromptContextHead) -> list[str]:
    """"<context words> <class name>." per class; the words' embeddings become the context."""
    return [f"{head.words} {name.replace('_', ' ')}." for name in data.classnames]


METHOD = Method(
    name="coop",
    cites="CoOp (Zhou et al., IJCV 2022, arXiv 2109.01134), sec. 3.2, eq. 2",
    trains="M context vectors (M x text width) before the class name, frozen CLIP",
    build_head=build_head,
    loss=cross_entropy_loss,
    kind_keys=SHARED_KEYS,
    space={"adapter.context_tokens": Choice((4, 8)),
           "adapter.context_init": Choice((RANDOM_INIT, "a photo of a"))},
    protocol=FROZEN_CLIP,
    own_keys=("adapter.context_tokens", "adapter.context_init"),
    tasks=("classification",),
    unseen_rule="their own names after the same learned context (the paper's unified context)",
    prompts=prompts,
    frozen_image_tower=True,
)

