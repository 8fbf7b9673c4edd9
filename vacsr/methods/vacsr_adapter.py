"""VACSR (paper sec. 3): the variational similarity adapter on the Hadamard product of CLIP's image
and text features, trained with L = alpha L_KL + beta (L_recon + gamma (L_sigma^P + L_sigma^N))
(sec. 3.2) together with the trainable blocks of both towers (appendix C.2)."""
from __future__ import annotations

from dataclasses import asdict

from vacsr.config import DEFAULT_METHOD
from vacsr.methods.method import Method


def build_head(adapter, backbone):
    from vacsr.model.adapter import head_from_config

    return head_from_config(adapter, backbone.embed_dim)


def loss(head, image_feats, text_feats, labels, loss_config):
    """The paper's objective; with `loss.backbone_grad: recon` only beta L_recon reaches the
    backbone (an ablation, vacsr/model/backbone_grad.py)."""
    from vacsr.model.backbone_grad import vacsr_loss_recon_to_backbone
    from vacsr.model.losses import vacsr_loss

    options = asdict(loss_config)
    if options.pop("backbone_grad") == "recon":
        return vacsr_loss_recon_to_backbone(head, image_feats, text_feats, labels, **options)
    return vacsr_loss(head(image_feats, text_feats), labels, **options)


METHOD = Method(
    name=DEFAULT_METHOD,
    cites="VACSR (arXiv 2605.30968), sec. 3.1-3.2",
    trains="the variational adapter and the searched trainable blocks of both towers",
    build_head=build_head,
    loss=loss,
    own_keys=("adapter.hidden_dim", "adapter.latent_dim", "adapter.num_components",
              "adapter.decoder_hidden_dim", "adapter.bounded_sigma", "adapter.logvar_bound",
              "adapter.init_logit_bias", "adapter.init", "loss.alpha_kl", "loss.beta",
              "loss.gamma", "loss.num_hard_negatives", "loss.straight_through",
              "loss.neg_sigma_target", "loss.use_kl", "loss.use_sigma_loss", "loss.reduction",
              "loss.neg_columns", "loss.backbone_grad"),
)
