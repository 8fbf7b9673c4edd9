"""AdamP with parameter groups, and per-step learning-rate factors for the schedules."""
from __future__ import annotations

import math

from adamp import AdamP
from torch import nn


def parameter_groups(model: nn.Module, *, lr: float, weight_decay: float,
                     backbone_lr_mult: float) -> list[dict]:
    """Trainable parameters in up to four groups: (head | backbone) x (decay | no decay).

    New modules (adapter, GPO) train at `lr`; the pretrained CLIP at `lr * backbone_lr_mult`.
    1-D parameters (biases, norms, scalars) get no weight decay.
    """
    groups: dict[tuple[str, bool], list] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        part = "backbone" if name.startswith("backbone.clip.") else "head"
        decay = param.ndim > 1 and not name.endswith("positional_embedding")
        groups.setdefault((part, decay), []).append(param)
    result = []
    for (part, decay), params in sorted(groups.items()):
        group_lr = lr * (backbone_lr_mult if part == "backbone" else 1.0)
        result.append({"params": params, "lr": group_lr, "base_lr": group_lr,
                       "weight_decay": weight_decay if decay else 0.0,
                       "name": f"{part}{'' if decay else '_no_decay'}"})
    return result


def build_optimizer(model: nn.Module, optim_config) -> AdamP:
    groups = parameter_groups(model, lr=optim_config.lr, weight_decay=optim_config.weight_decay,
                              backbone_lr_mult=optim_config.backbone_lr_mult)
    if not groups:
        raise ValueError("no trainable parameters")
    return AdamP(groups, lr=optim_config.lr, betas=(0.9, 0.999),
                 weight_decay=optim_config.weight_decay)


def lr_factor(progress: float, *, epochs: int, schedule: str, decay_epochs=(15,),
              decay_factor: float = 0.1, warmup_epochs: int = 0) -> float:
    """Multiplier of the base lr at fractional epoch `progress` (0 <= progress < epochs)."""
    warmup = min(1.0, (progress + 1e-12) / warmup_epochs) if warmup_epochs > 0 else 1.0
    if schedule == "step":
        return warmup * decay_factor ** sum(progress >= e for e in decay_epochs)
    if schedule == "cosine":
        return warmup * 0.5 * (1.0 + math.cos(math.pi * min(progress / epochs, 1.0)))
    return warmup


def set_learning_rates(optimizer, factor: float) -> dict[str, float]:
    """Apply `factor` to every group's base lr; return {"lr/<group>": lr}."""
    rates = {}
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor
        rates[f"lr/{group['name']}"] = group["lr"]
    return rates
