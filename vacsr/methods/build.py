"""A config's model: the open_clip backbone and the head of the method `adapter.kind` names."""
from __future__ import annotations

from vacsr.methods.registry import method_of
from vacsr.model.backbone import build_backbone
from vacsr.model.vacsr import VACSRModel


def build_model(config) -> VACSRModel:
    """Config -> VACSRModel: backbone from config.model, the method's head from config.adapter."""
    method = method_of(config.adapter.kind)
    backbone = build_backbone(config.model)
    head = method.build_head(config.adapter, backbone)
    if method.hooked_blocks is not None:  # a deep method: its head acts inside the towers
        backbone.attach_hooks(head.tower_hooks())
    return VACSRModel(backbone, head, method)
