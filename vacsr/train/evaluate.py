"""End-of-epoch evaluation: encode a split with the eval transform, score, compute metrics."""
from __future__ import annotations

from contextlib import nullcontext

import torch

from vacsr.data.base import ClassificationData, RetrievalData
from vacsr.data.loader import image_loader
from vacsr.eval.metrics import accuracy, retrieval_metrics
from vacsr.model.vacsr import VACSRModel


@torch.no_grad()
def encode_images(model: VACSRModel, images, *, device, batch_size: int = 128,
                  autocast=nullcontext) -> torch.Tensor:
    """List of image refs -> (N, d) float32 features on `device`."""
    loader = image_loader(images, model.backbone.eval_transform, batch_size=batch_size,
                          device=device)
    feats = []
    for batch, _ in loader:
        with autocast():
            feats.append(model.encode_image(batch.to(device)).float())
    return torch.cat(feats)


@torch.no_grad()
def encode_texts(model: VACSRModel, texts: list[str], *, device, batch_size: int = 256,
                 autocast=nullcontext) -> torch.Tensor:
    """List of strings -> (N, d) float32 features on `device`."""
    feats = []
    for start in range(0, len(texts), batch_size):
        tokens = model.backbone.tokenize(texts[start:start + batch_size]).to(device)
        with autocast():
            feats.append(model.encode_text(tokens).float())
    return torch.cat(feats)


@torch.no_grad()
def score_matrix(model: VACSRModel, queries: torch.Tensor, items: torch.Tensor,
                 chunk: int = 64):
    """(N_q, N_g) logits and sigma_hat (None for the baseline), scored chunk by chunk of queries."""
    logits, sigmas = [], []
    for start in range(0, queries.shape[0], chunk):
        block_logits, block_sigma = model.score(queries[start:start + chunk], items)
        logits.append(block_logits.float().cpu())
        if block_sigma is not None:
            sigmas.append(block_sigma.float().cpu())
    return torch.cat(logits), (torch.cat(sigmas) if sigmas else None)


@torch.no_grad()
def evaluate_split(model: VACSRModel, data, *, task: str, device, batch_size: int = 128,
                   autocast=nullcontext) -> dict[str, float]:
    """Retrieval: R@K both ways + RSUM; classification: accuracy. Adds mean sigma_hat."""
    was_training = model.training
    model.eval()
    try:
        image_feats = encode_images(model, data.images, device=device, batch_size=batch_size,
                                    autocast=autocast)
        if task == "retrieval":
            assert isinstance(data, RetrievalData)
            text_feats = encode_texts(model, data.captions, device=device, autocast=autocast)
            scores, sigma = score_matrix(model, image_feats, text_feats)
            metrics = retrieval_metrics(scores, data.caption_to_image)
        else:
            assert isinstance(data, ClassificationData)
            text_feats = encode_texts(model, data.prompts(), device=device, autocast=autocast)
            scores, sigma = score_matrix(model, image_feats, text_feats)
            metrics = {"acc": accuracy(scores, data.labels)}
        if sigma is not None:
            metrics["sigma_hat_mean"] = sigma.mean().item()
        return metrics
    finally:
        model.train(was_training)
