"""End-of-epoch evaluation: encode a split with the eval transform, score, compute metrics."""
from __future__ import annotations

from contextlib import nullcontext

import torch

from vacsr.data.base import ClassificationData, RetrievalData
from vacsr.data.encoding import encode_images, encode_texts
from vacsr.errors import DataError
from vacsr.eval.evaluate import evaluate_classification, evaluate_retrieval
from vacsr.model.vacsr import VACSRModel


COCO_1K_FOLDS = 5


def coco1k_folds(task: str, split: str, num_images: int) -> int | None:
    """Folds of the COCO 1K recalls (coco1k_*, paper Tables 1-3): 5 on a retrieval test split whose
    images split into 5 equal folds (COCO 5K: 1,000 each); None elsewhere (val stays cheap)."""
    if (task == "retrieval" and split == "test" and num_images >= COCO_1K_FOLDS
            and num_images % COCO_1K_FOLDS == 0):
        return COCO_1K_FOLDS
    return None


@torch.no_grad()
def evaluate_split(model: VACSRModel, data, *, task: str, device, batch_size: int = 128,
                   autocast=nullcontext, scorer=None, **engine_kwargs) -> dict[str, float]:
    """Encode a split, then score it with the evaluation engine (chunked scorer, or the Ray
    EvalPool passed as `scorer`). Retrieval: R@K both ways, RSUM (COCO 1K / ECCV / CxC when the
    ids say COCO test; semantic mAP@R / R-P / R@1, sem_*, when the data has image_groups);
    classification: accuracy. Both with sigma_hat of the top-1 item."""
    was_training = model.training
    model.eval()
    try:
        encode = {"autocast": autocast, "keep_on_device": True}
        image_feats = encode_images(model.backbone, data.images, batch_size=batch_size, **encode)
        if task == "retrieval":
            assert isinstance(data, RetrievalData)
            text_feats = encode_texts(model.backbone, data.captions, **encode)
            return evaluate_retrieval(image_feats, text_feats, model.head, data.caption_to_image,
                                      data.image_ids or None, data.caption_ids or None,
                                      image_groups=data.image_groups, device=device,
                                      scorer=scorer, **engine_kwargs)
        assert isinstance(data, ClassificationData)
        text_feats = encode_texts(model.backbone, data.prompts(), **encode)
        return evaluate_classification(image_feats, text_feats, model.head, data.labels,
                                       device=device, scorer=scorer)
    finally:
        model.train(was_training)


def evaluate_checkpoint(config, checkpoint_path, *, dataset: str | None = None,
                        subsample: str | None = None, split: str = "test",
                        device=None, **engine_kwargs) -> dict[str, float]:
    """Metrics of a trained checkpoint on another split: the novel classes of a base-to-novel
    dataset (zero-shot: prompts of classes never trained on), or an ImageNet variant."""
    from dataclasses import replace

    from vacsr.data import build_classification, build_retrieval
    from vacsr.model.vacsr import build_model
    from vacsr.train.checkpoint import load_checkpoint

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    data = replace(config.data, dataset=dataset or config.data.dataset,
                   subsample_classes=subsample or config.data.subsample_classes)
    build = build_retrieval if data.task == "retrieval" else build_classification
    splits = build(data, config.train.seed)
    model = build_model(config).to(device)
    model.load_state_dict(load_checkpoint(checkpoint_path, device)["model"])
    if split not in splits:
        raise DataError(f"{data.dataset}: no {split!r} split (has: {', '.join(splits)})")
    folds = coco1k_folds(data.task, split, len(splits[split].images))
    if folds and "num_folds" not in engine_kwargs:
        engine_kwargs["num_folds"] = folds
    return evaluate_split(model, splits[split], task=data.task, device=device,
                          batch_size=max(config.train.batch_size, 64), **engine_kwargs)
