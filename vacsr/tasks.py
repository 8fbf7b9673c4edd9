"""Tasks: turn a batch into (loss, dict of named parts) and score (queries x items) blocks.

A loss is split into `features` (per-rank work: the backbone on the local batch) and
`loss_from_pairs` (needs every pair of the global batch), so a distributed trainer can gather the
features of all ranks in between.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from vacsr.model.losses import sigmoid_loss, vacsr_loss
from vacsr.model.vacsr import VACSRModel


@dataclass
class PairBatch:
    """Features of one batch; y_ij = [image_keys[i] == text_keys[j]]."""

    image_feats: torch.Tensor  # (B, d)
    text_feats: torch.Tensor  # (B', d)
    image_keys: torch.Tensor  # (B,) image index (retrieval) or class label (classification)
    text_keys: torch.Tensor  # (B',) image index of each caption, or class index
    text_is_shared: bool = False  # class prompts: identical on every rank, never gathered

    def labels(self) -> torch.Tensor:
        return (self.image_keys[:, None] == self.text_keys[None, :]).float()  # (B, B')

    def float(self) -> "PairBatch":
        return replace(self, image_feats=self.image_feats.float(),
                       text_feats=self.text_feats.float())


class _Task:
    def __init__(self, model: VACSRModel, loss_config) -> None:
        self.model = model
        self.loss_kwargs = asdict(loss_config)

    def loss_from_pairs(self, pairs: PairBatch):
        """All B x B' pairs of the (gathered) batch -> (loss, parts)."""
        output = self.model.head(pairs.image_feats, pairs.text_feats)
        if output.sigma_hat is None:  # the sigmoid baseline head
            return sigmoid_loss(output.logits, pairs.labels())
        return vacsr_loss(output, pairs.labels(), **self.loss_kwargs)

    def loss(self, batch):
        return self.loss_from_pairs(self.features(batch))

    def score(self, queries: torch.Tensor, items: torch.Tensor):
        """Inference (logits, sigma_hat) of a (queries x items) block."""
        return self.model.score(queries, items)


class RetrievalTask(_Task):
    """Batch = (images (B,3,H,W), caption token ids (B,T), image index (B,)); a caption is a
    positive of every image in the batch with the same index (duplicates count)."""

    def features(self, batch) -> PairBatch:
        images, tokens, image_index = batch
        return PairBatch(self.model.encode_image(images), self.model.encode_text(tokens),
                         image_index, image_index)


class ClassificationTask(_Task):
    """Batch = (images (B,3,H,W), labels (B,)); the texts are every class prompt, so
    y_ij = [label(i) == j] over a (B, C) block."""

    def __init__(self, model: VACSRModel, loss_config, prompt_tokens: torch.Tensor) -> None:
        super().__init__(model, loss_config)
        self.prompt_tokens = prompt_tokens  # (C, T)
        self._frozen_text: torch.Tensor | None = None

    def text_trainable(self) -> bool:
        return any(p.requires_grad for name, p in self.model.backbone.named_parameters()
                   if not name.startswith(("clip.visual.", "image_gpo.")))

    def class_features(self, device) -> torch.Tensor:
        """(C, d) prompt features: recomputed every step while text blocks train, computed once
        when the text tower is frozen (hundreds of prompts per step are the cost otherwise)."""
        tokens = self.prompt_tokens.to(device)
        if self.text_trainable():
            return self.model.encode_text(tokens)
        if self._frozen_text is None or self._frozen_text.device != torch.device(device):
            with torch.no_grad():
                self._frozen_text = self.model.encode_text(tokens)
        return self._frozen_text

    def features(self, batch) -> PairBatch:
        images, labels = batch
        class_index = torch.arange(self.prompt_tokens.shape[0], device=images.device)
        return PairBatch(self.model.encode_image(images), self.class_features(images.device),
                         labels, class_index, text_is_shared=True)
