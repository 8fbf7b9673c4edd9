"""The sigmoid baseline, "w/o all components" of the paper's Table 6: SigLIP's pairwise sigmoid
loss on t cos(v, w) + b (Zhai et al., ICCV 2023, eq. 1), with the same trainable blocks as VACSR
and no adapter."""
from __future__ import annotations

from vacsr.methods.method import Method


def build_head(adapter, backbone):
    from vacsr.model.adapter import SigmoidBaselineHead

    return SigmoidBaselineHead()


def loss(head, image_feats, text_feats, labels, loss_config):
    from vacsr.model.losses import sigmoid_loss

    return sigmoid_loss(head(image_feats, text_feats).logits, labels)


METHOD = Method(
    name="sigmoid_baseline",
    cites="VACSR (arXiv 2605.30968), Table 6 \"w/o all components\"; SigLIP's loss",
    trains="t and b of the sigmoid head and the searched trainable blocks of both towers",
    build_head=build_head,
    loss=loss,
)
