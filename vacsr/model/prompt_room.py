"""The room a learned prompt context leaves for the class name. CoOp's prompt is
"[V]_1 ... [V]_M [CLASS]." (Zhou et al., IJCV 2022, sec. 3.2): of the model's T text positions it
takes <SOT>, the M context tokens, at least one token of the class name and <EOT>, so M <= T - 3.
M is `adapter.context_tokens` for a random init, else the init phrase's own token count.

One rule for both places that apply it: a sweep's plan, for every value its trials can draw
(vacsr/sweep/plan/methods.py), and the model's build (vacsr/model/clip_heads.py). Nothing here
imports torch or open_clip until a phrase is counted.
"""
from __future__ import annotations

import re

from vacsr.errors import ConfigError

COUNT_KEY = "adapter.context_tokens"
INIT_KEY = "adapter.context_init"
RANDOM_INIT = "random"  # M vectors drawn at random; any other init is a phrase
AROUND_CONTEXT = 3  # <SOT>, a token of the class name, <EOT>
# How CLIP's tokenizer splits a lower-cased text before its byte-pair merges (Radford et al.
# 2019, sec. 2.2; CLIP reuses it): contractions, runs of letters, single digits, runs of other
# symbols. Each piece is one token or more.
_PIECES = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d|[^\W\d_]+|\d|[^\s\w]+|_+")


LONG_RUN = 12  # letters: longer runs are mostly words run together ("yellowtriangleright")
LETTERS_PER_TOKEN = 4  # ... which the merges split about this often


def word_pieces(text: str) -> int:
    """About the tokens CLIP's tokenizer encodes `text` in, counted without it (a sweep's driver
    imports no torch): one per piece (a common word is one token), a long run of letters one
    per LETTERS_PER_TOKEN. Exact on names of common words; a rare word's merges may give a
    token or two more."""
    return sum(-(-len(piece) // LETTERS_PER_TOKEN) if len(piece) > LONG_RUN else 1
               for piece in _PIECES.findall(text.lower()))


def prompt_length(context_tokens: int, context_init: str, name_pieces: int) -> int:
    """Positions of "<SOT> <context> <name>. <EOT>" (vacsr/model/clip_heads.py context_prompts)
    for a name of `name_pieces` word pieces, the phrase's counted as word pieces too."""
    m = int(context_tokens) if context_init == RANDOM_INIT else word_pieces(context_init)
    return m + name_pieces + 3  # <SOT>, ".", <EOT>


def text_positions(model: str) -> int | None:
    """The text tower's context length from `model`'s config (open_clip's default 77); None for
    a model whose config only open_clip resolves."""
    from vacsr.model.configs import model_config

    config = model_config(model)
    return None if config is None else int(config.get("text_cfg", {}).get("context_length", 77))


def phrase_ids(tokenizer, phrase: str):
    """The token ids of `phrase` between its start and end tokens, all of them: (M,). The
    tokenizer cuts a text at the length it is given; twice the phrase's bytes hold it whole (a
    byte-level BPE token spans a byte at least, and lowercasing lengthens no character by more
    than half)."""
    ids = tokenizer([phrase], context_length=2 * len(phrase.encode()) + 2)[0]  # (L,)
    return ids[1:int(ids.argmax())]  # EOT: the highest id in the vocabulary


def fits_uncounted(context_init: str, model: str, positions: int) -> bool:
    """True when an init phrase surely fits without its tokens being counted: CLIP's byte-level
    BPE (Radford et al. 2021, sec. 2.4) gives a phrase at most one token per byte of its
    lower-cased text, so a short phrase ("a photo of a") needs no tokenizer, and a sweep's
    driver no torch. Models whose config names another tokenizer are always counted."""
    from vacsr.model.configs import model_config

    text_cfg = (model_config(model) or {}).get("text_cfg")
    clip_bpe = text_cfg is not None and not text_cfg.get("hf_tokenizer_name")
    return clip_bpe and len(context_init.lower().encode()) + AROUND_CONTEXT <= positions


def context_size(context_tokens: int, context_init: str, model: str) -> int:
    """M: the count asked for with a random init, else the phrase's tokens by `model`'s
    tokenizer."""
    if context_init == RANDOM_INIT:
        return int(context_tokens)
    from vacsr.model.backbone import model_tokenizer

    return len(phrase_ids(model_tokenizer(model), context_init))


def check_room(context_tokens: int, context_init: str, model: str, positions: int,
               runs: str = "") -> None:
    """One line when the context leaves no room for a class name in `model`'s `positions` text
    positions. `runs`: the runs that can draw these values (a sweep's plan), else the one
    being built."""
    if context_init != RANDOM_INIT and fits_uncounted(context_init, model, positions):
        return
    m = context_size(context_tokens, context_init, model)
    if m + AROUND_CONTEXT <= positions:
        return
    most = positions - AROUND_CONTEXT
    room = f"no room for a class name in {model}'s {positions} text positions"
    if context_init == RANDOM_INIT:
        said = f"{runs} can take {m}, which leaves" if runs else f"{m} context tokens leave"
        raise ConfigError(f"{COUNT_KEY}: {said} {room}; expected at most {most}")
    said = (f"{runs} can take {context_init!r}, which is {m} tokens and leaves" if runs
            else f"{context_init!r} is {m} tokens, which leave")
    raise ConfigError(f"{INIT_KEY}: {said} {room}; expected a phrase of at most {most} tokens")
