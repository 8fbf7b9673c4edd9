"""A distributed step's features, gathered from every rank (vacsr/distributed/worker.py
gather_pairs), give each rank the gradient a one-process step gives its rows, W times (every rank
computes the same global loss; DDP's mean divides the W out), for the three kinds of text a batch
holds: captions (retrieval), class prompts shared by every rank, and each image's own class
features (CoCoOp), whose upstream gradient from the head's einsum is not contiguous. Two gloo
processes, no Ray."""
from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

pytestmark = pytest.mark.timeout(180)

WORLD, LOCAL, CLASSES, DIM = 2, 3, 4, 8


def _inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    rows = WORLD * LOCAL
    return {"image": torch.randn(rows, DIM, generator=generator),
            "captions": torch.randn(rows, DIM, generator=generator),
            "prompts": torch.randn(CLASSES, DIM, generator=generator),
            "per_image": torch.randn(rows, CLASSES, DIM, generator=generator),
            "labels": torch.arange(rows) % CLASSES}


def _losses(pairs_of, gather) -> dict[str, torch.Tensor]:
    """Each kind's loss through `gather` (None: one process), and the leaves it reads."""
    from vacsr.model.clip_heads import CosineHead, cross_entropy_loss
    from vacsr.model.cocoop import ConditionalContextHead

    cosine = CosineHead(logit_scale=math.log(100.0))
    conditioned = ConditionalContextHead(logit_scale=math.log(100.0),
                                         context=torch.zeros(2, DIM), words="X X",
                                         image_dim=DIM)
    losses = {}
    for kind, head in (("captions", cosine), ("prompts", cosine), ("per_image", conditioned)):
        pairs = pairs_of(kind)
        if gather is not None:
            pairs = gather(pairs)
        if kind == "captions":  # retrieval: CLIP-style scores of every (image, caption) pair
            logits = head(pairs.image_feats, pairs.text_feats).logits
            labels = pairs.labels()
            losses[kind] = -(F.log_softmax(logits, dim=1) * labels).sum() / labels.shape[0]
        else:
            losses[kind] = cross_entropy_loss(head, pairs.image_feats, pairs.text_feats,
                                              pairs.labels(), None)[0]
    return losses


def _pairs(data: dict, rows: slice):
    """kind -> a PairBatch of `rows`, its feature tensors leaves that keep their gradient."""
    from vacsr.tasks import PairBatch

    leaves = {}

    def pairs_of(kind: str) -> PairBatch:
        image = data["image"][rows].clone().requires_grad_()
        keys = data["labels"][rows]
        index = torch.arange(data["image"].shape[0])[rows]
        if kind == "captions":
            text = data["captions"][rows].clone().requires_grad_()
            batch = PairBatch(image, text, index, index)
        elif kind == "prompts":
            text = data["prompts"].clone().requires_grad_()
            batch = PairBatch(image, text, keys, torch.arange(CLASSES), text_is_shared=True)
        else:
            text = data["per_image"][rows].clone().requires_grad_()
            batch = PairBatch(image, text, keys, torch.arange(CLASSES), text_per_image=True)
        leaves[kind] = (image, text)
        return batch

    return pairs_of, leaves


def _grads(losses, leaves) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    for loss in losses.values():
        loss.backward()
    return {kind: (image.grad.clone(), text.grad.clone()) for kind, (image, text) in
            leaves.items()}


def _rank(rank: int, port: int, queue) -> None:
    import torch.distributed as dist

    from vacsr.distributed.worker import gather_pairs

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        pairs_of, leaves = _pairs(_inputs(), slice(rank * LOCAL, (rank + 1) * LOCAL))
        losses = _losses(pairs_of, gather_pairs)
        grads = {kind: tuple(g.numpy() for g in pair)  # by value: the process ends next
                 for kind, pair in _grads(losses, leaves).items()}
        queue.put((rank, {k: v.item() for k, v in losses.items()}, grads))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_each_rank_gets_its_rows_gradient_of_the_global_loss_for_every_kind_of_text():
    pairs_of, leaves = _pairs(_inputs(), slice(None))
    losses = _losses(pairs_of, None)
    expected = _grads(losses, leaves)
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    workers = [context.Process(target=_rank, args=(rank, port, queue)) for rank in range(WORLD)]
    for worker in workers:
        worker.start()
    results = {rank: (loss, grads) for rank, loss, grads in
               (queue.get(timeout=120) for _ in workers)}
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    for rank, (rank_losses, grads) in results.items():
        rows = slice(rank * LOCAL, (rank + 1) * LOCAL)
        for kind, (image_grad, text_grad) in grads.items():
            image_grad, text_grad = torch.from_numpy(image_grad), torch.from_numpy(text_grad)
            assert rank_losses[kind] == pytest.approx(losses[kind].item(), rel=1e-6), kind
            torch.testing.assert_close(image_grad, WORLD * expected[kind][0][rows], rtol=1e-5,
                                       atol=1e-6, msg=kind)
            # shared prompts are not gathered: every rank's gradient is the whole one
            own = expected[kind][1] if kind == "prompts" else WORLD * expected[kind][1][rows]
            torch.testing.assert_close(text_grad, own, rtol=1e-5, atol=1e-6, msg=kind)
