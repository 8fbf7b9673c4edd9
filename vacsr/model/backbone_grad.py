"""Which terms of the VACSR loss train the backbone (`loss.backbone_grad`).

The paper (sec. 3.2) gives one objective, L = alpha L_KL + beta (L_recon + gamma (L_sigma^P +
L_sigma^N)), and trains the backbone's unfrozen blocks with it (appendix C.2); which terms reach
the backbone it leaves open. "all" back-propagates every term into the features. "recon" lets
only beta L_recon reach them: the adapter still learns from the whole loss, but the
uncertainty terms (L_sigma's 1 / sigma_hat weighting and log sigma_hat) and L_KL no longer move
the encoders. Both passes draw the same z, so the adapter's gradient and the loss value are those
of "all" (the default). The measurements are in docs/method.md ("Trainable blocks").
"""
from __future__ import annotations

import torch
from torch.func import functional_call

from vacsr.model.losses import vacsr_loss


def _rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def vacsr_loss_recon_to_backbone(head, image_feats: torch.Tensor, text_feats: torch.Tensor,
                                 labels: torch.Tensor, **loss_kwargs):
    """vacsr_loss over all pairs, its value and adapter gradient unchanged, with only
    beta L_recon's gradient reaching the features (and so the backbone).

    The adapter runs twice on the same noise: on detached features for the whole loss (the
    adapter's gradient), and with detached adapter weights for L_recon alone, added as
    r - r.detach() (zero in value, L_recon's gradient in the features)."""
    device = image_feats.device
    state = _rng_state(device)
    output = head(image_feats.detach(), text_feats.detach())
    loss, parts = vacsr_loss(output, labels, **loss_kwargs)
    if not (image_feats.requires_grad or text_feats.requires_grad):
        return loss, parts
    _set_rng_state(device, state)  # the same z: L_recon's feature gradient at this step's sample
    frozen = {name: p.detach() for name, p in head.named_parameters()}
    frozen.update(dict(head.named_buffers()))
    through = functional_call(head, frozen, (image_feats, text_feats))
    recon_only = {**loss_kwargs, "use_kl": False, "use_sigma_loss": False}
    recon, _ = vacsr_loss(through, labels, **recon_only)
    return loss + (recon - recon.detach()), parts
