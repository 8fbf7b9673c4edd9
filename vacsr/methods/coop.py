"""CoOp (Zhou et al., IJCV 2022, arXiv 2109.01134, sec. 3.2): M learned context vectors take the
place of a prompt's words before the class name, "[V]_1 ... [V]_M [CLASS]." (class token at the
end), and go through the frozen text tower; only the context trains, with cross-entropy on CLIP's
scoring (eq. 2). The context is one for all classes (unified), so a class never trained on is
scored by its own name after the same learned context (vacsr/model/clip_heads.py
PromptContextHead).

Its init (`adapter.context_init`, searched): "random" draws M = `adapter.context_tokens` vectors
from N(0, 0.02^2) (the paper's init; M is searched for these trials alone); a phrase ("a photo of
a") starts the context at that phrase's own token embeddings, M its token count, so before the
first step CoOp is zero-shot CLIP with the template "<phrase> {}." exactly.
"""
from __future__ import annotations

from vacsr.config.domains import Choice
from vacsr.methods.method import FROZEN_CLIP, SHARED_KEYS, Method, cross_entropy
from vacsr.model.prompt_room import COUNT_KEY, INIT_KEY, RANDOM_INIT


def build_head(adapter, backbone):
    from vacsr.model.clip_heads import (
        PromptContextHead,
        clip_logit_scale,
        context_words,
        initial_context,
    )

    return PromptContextHead(logit_scale=clip_logit_scale(backbone),
                             context=initial_context(adapter, backbone),
                             words=context_words(adapter))


def context_space(counts: tuple[int, ...]) -> dict:
    """A learned context's search: its init, and under a random one alone (a phrase sets M) its
    count of vectors."""
    return {INIT_KEY: Choice((RANDOM_INIT, "a photo of a")),
            COUNT_KEY: Choice(counts, when=(INIT_KEY, RANDOM_INIT))}


def prompts(data, head) -> list[str]:
    from vacsr.model.clip_heads import context_prompts

    return context_prompts(data, head)


METHOD = Method(
    name="coop",
    cites="CoOp (Zhou et al., IJCV 2022, arXiv 2109.01134), sec. 3.2, eq. 2",
    trains="M context vectors (M x text width) before the class name, frozen CLIP",
    build_head=build_head,
    loss=cross_entropy,
    kind_keys=SHARED_KEYS,
    space=context_space(counts=(4, 8)),
    protocol=FROZEN_CLIP,
    own_keys=(COUNT_KEY, INIT_KEY),
    tasks=("classification",),
    unseen_rule="their own names after the same learned context (the paper's unified context)",
    prompts=prompts,
    frozen_image_tower=True,
    encodes_prompts=True,
    learned_context=True,
)
