"""CLIP's own contrastive fine-tuning (Radford et al., ICML 2021, sec. 2.3 and Fig. 3): the
symmetric cross-entropy (InfoNCE) over the batch's image-caption similarity matrix exp(t) cos(v, w),
with CLIP's learned temperature t trained from the backbone's value and clipped at log 100
(sec. 2.5; vacsr/model/clip_heads.py ContrastiveHead, contrastive_loss). It trains the same blocks
of both towers as VACSR (the sweep's searched blocks, side and backbone lr multiplier) and no
adapter, as the sigmoid baseline does with SigLIP's loss. A batch's several positives in a row
(captions of one image, noisy pairs) are soft targets. Retrieval only: the classification
comparison has its cross-entropy methods (the linear probe, CLIP-Adapter, CoOp)."""
from __future__ import annotations

from vacsr.methods.method import Method


def build_head(adapter, backbone):
    from vacsr.model.clip_heads import ContrastiveHead, clip_logit_scale

    return ContrastiveHead(logit_scale=clip_logit_scale(backbone))


def loss(head, image_feats, text_feats, labels, loss_config):
    from vacsr.model.clip_heads import contrastive_loss

    return contrastive_loss(head, image_feats, text_feats, labels)


METHOD = Method(
    name="clip_contrastive",
    cites="CLIP (Radford et al., ICML 2021), sec. 2.3 and Fig. 3: symmetric InfoNCE with the "
          "learned temperature",
    trains="CLIP's temperature and the searched trainable blocks of both towers",
    build_head=build_head,
    loss=loss,
    tasks=("retrieval",),
)
