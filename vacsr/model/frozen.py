"""The one rule for a tower's frozen prefix: how many leading blocks run as a constant of the
input (no autograd in training, cached in evaluation passes, credited as such by the memory and
cost estimates).

The paper trains "a few" blocks of each tower (appendix C.2). The prefix is the embeddings and the
blocks below the first trainable one:

    side last, N of L blocks train     L - N
    N = 0 (either side)                L      the whole tower is frozen
    side first, N >= 1; N = -1 (all)   0      the gradient reaches the first block
    embeddings train, or the tower
    cannot be split (prefix.py)        0
    a deep method hooks block j        at most j  (vacsr/model/tower_hooks.py)

Depth 0 means no prefix at all: the stem's output alone is never cached or run apart (it saves
nothing). Pure (config values in, a count out) and free of torch, so the sweep's cost estimate
reads the same rule as the backbone without building a model.
"""
from __future__ import annotations


def frozen_blocks(side: str, trainable: int, depth: int, *, embeddings_trainable: bool = False,
                  split_supported: bool = True, first_hook: int | None = None) -> int:
    """Leading blocks of a `depth`-block tower that form its frozen prefix; `trainable`: the
    tower's trainable block count (-1: all), `side`: model.trainable_side; `first_hook`: the
    lowest block a deep method's hook touches (None: none)."""
    if embeddings_trainable or not split_supported or trainable == -1:
        return 0
    frozen = depth if trainable == 0 else max(depth - trainable, 0) if side == "last" else 0
    return frozen if first_hook is None else min(frozen, first_hook)


def gradient_blocks(side: str, trainable: int, depth: int, *,
                    embeddings_trainable: bool = False, first_hook: int | None = None) -> int:
    """Blocks the backward pass crosses (they keep activations): all above the frozen prefix.
    Autograd records no block below the first trainable one (or hooked one) whether or not the
    tower is split, so this counts as if it were."""
    return depth - frozen_blocks(side, trainable, depth, embeddings_trainable=embeddings_trainable,
                                 first_hook=first_hook)
