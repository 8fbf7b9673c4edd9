"""The linear probe initialised at the zero-shot prototypes (ZS-LP of CLAP, Silva-Rodriguez et al.,
CVPR 2024, sec. 3.2): one weight vector per training class, trained with cross-entropy on frozen
CLIP image features and started at that class's prompt feature, so before its first step it is
zero-shot CLIP exactly.

The weight of class c is w_c = t_c + delta_c (vacsr/model/clip_heads.py PrototypeHead), with t_c
the frozen prompt feature and delta_c trained from 0: the same linear classifier as training w_c
from t_c. The head keeps the class names of its rows, and another class set is scored by name
(vacsr/model/clip_heads.py prototypes_for): a class it trained on keeps t_c + delta_c (ImageNet's
classes on ImageNet-V2, -Sketch, -A and -R, in their order and subsets), any other (novel
classes, another dataset) has no weight and is scored by its zero-shot prototype t_c. A
checkpoint without the names scores every such class zero-shot. Weight decay pulls w toward the
prototypes (searched).
"""
from __future__ import annotations

from vacsr.config.domains import Choice
from vacsr.methods.method import FROZEN_CLIP, SHARED_KEYS, Method, cross_entropy


def build_head(adapter, backbone):
    from vacsr.model.clip_heads import PrototypeHead, clip_logit_scale

    return PrototypeHead(logit_scale=clip_logit_scale(backbone), embed_dim=backbone.embed_dim)


def unseen_head(head, data):
    from vacsr.model.clip_heads import prototypes_for

    return prototypes_for(head, data.classnames)


METHOD = Method(
    name="linear_probe",
    cites="CLAP (Silva-Rodriguez et al., CVPR 2024), sec. 3.2: ZS-LP, a linear probe initialised "
          "at the zero-shot prototypes",
    trains="one prototype per base class (C x d), on frozen CLIP features",
    build_head=build_head,
    loss=cross_entropy,
    kind_keys=SHARED_KEYS,
    space={"optim.weight_decay": Choice((0.0, 1e-4, 1e-2))},
    protocol=FROZEN_CLIP,
    tasks=("classification",),
    unseen_head=unseen_head,
    unseen_rule="by name: a class it trained on keeps its prototype, any other its zero-shot "
                "prototype (no trained weight exists for it)",
    frozen_image_tower=True,
    class_weights=True,
)
