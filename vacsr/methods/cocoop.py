"""CoCoOp (Zhou et al., "Conditional Prompt Learning for Vision-Language Models", CVPR 2022, arXiv
2203.05557, sec. 3.2): CoOp's learned context, each vector shifted by a token a meta-net computes
from the image (vacsr/model/cocoop.py), so the prompts are conditioned on each input and, its
paper argues, generalise better to classes never trained on. Only the context and the meta-net
train, with cross-entropy on CLIP's scoring; CLIP stays frozen, its image features computed once.

Its base-to-novel setting (sec. 4): M = 4 context tokens started at "a photo of a", the meta-net
Linear-ReLU-Linear with a hidden width of the image feature's / 16, SGD at lr 0.002, batch 1,
10 epochs. Searched here as CoOp is: the init (and M under a random one) beside the budget every
compared method shares. Every image's C class prompts go through the text tower each step and
at evaluation, so a step costs batch x C text passes (sweep/cost/estimate.py).
"""
from __future__ import annotations

from vacsr.methods import coop
from vacsr.methods.method import Method


def build_head(adapter, backbone):
    from vacsr.model.clip_heads import clip_logit_scale, context_words, initial_context
    from vacsr.model.cocoop import ConditionalContextHead

    return ConditionalContextHead(logit_scale=clip_logit_scale(backbone),
                                  context=initial_context(adapter, backbone),
                                  words=context_words(adapter), image_dim=backbone.embed_dim)


METHOD = Method(
    name="cocoop",
    cites="CoCoOp (Zhou et al., CVPR 2022, arXiv 2203.05557), sec. 3.2",
    trains="M context vectors and a meta-net adding an image-conditional token to each, "
           "frozen CLIP",
    build_head=build_head,
    loss=coop.METHOD.loss,
    kind_keys=coop.METHOD.kind_keys,
    space=coop.METHOD.space,
    protocol=coop.METHOD.protocol,
    own_keys=coop.METHOD.own_keys,
    tasks=("classification",),
    unseen_rule="their own names after the same context and meta-net (conditioned on each "
                "image)",
    prompts=coop.prompts,
    frozen_image_tower=True,
    encodes_prompts=True,
    conditions_prompts=True,
    learned_context=True,
)
