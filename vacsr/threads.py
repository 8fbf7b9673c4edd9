"""torch's intra-op thread count for a block of work, restored after it."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with `count` intra-op threads. torch's count is process-wide: do not run
    CPU torch work in another Python thread of the same process meanwhile."""
    before = torch.get_num_threads()
    if before == count:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
