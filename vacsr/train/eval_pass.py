"""Evaluation: encode a split with the eval transform, score the pairs, compute metrics.

`evaluate_split` is the end-of-epoch path (model in memory). For a checkpoint the two halves are
separate: `encode_checkpoint` needs the backbone (and the GPU), `score_encoded` only the head and
the features, so the sweeps and `vacsr eval --actors` score on the evaluation actors.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from vacsr.errors import DataError
from vacsr.model.encoding import encode_images
from vacsr.model.prefix_cache import PrefixCache, open_cache
from vacsr.model.vacsr import VACSRModel
from vacsr.tasks import task_type


@dataclass
class EncodedSplit:
    """Features of one split and what its metrics need (a checkpoint's: on the CPU)."""

    task: str
    image_feats: torch.Tensor  # (N_i, d)
    text_feats: torch.Tensor  # (N_c, d): captions, or one prompt per class
    head: nn.Module  # the trained adapter
    targets: dict[str, Any]  # retrieval: caption_to_image, ids, groups; classification: labels
    num_folds: int | None = None
    precision: str = "auto"  # the scorer's (bf16 where the features were encoded under autocast)
    # inputs whose frozen-prefix outputs came from the prefix cache, and all inputs encoded
    cache_served: int = 0
    cache_evaluated: int = 0
    cache_rebuilt: tuple[str, ...] = ()  # the cache's lines on damaged files it rebuilt

    @property
    def items(self) -> torch.Tensor:
        return self.text_feats


@torch.no_grad()
def encode_split(model: VACSRModel, data, *, task: str, batch_size: int = 128,
                 autocast=nullcontext, keep_on_device: bool = False,
                 num_folds: int | None = None, precision: str = "auto",
                 cache: PrefixCache | None = None) -> EncodedSplit:
    """Encode a split with the eval transform: image features, and caption features (retrieval)
    or one prompt per class (classification). `precision` is recorded for the scorer; `cache`
    keeps the frozen prefix's outputs (vacsr/model/prefix_cache.py)."""
    was_training = model.training
    model.eval()
    try:
        encode = {"autocast": autocast, "keep_on_device": keep_on_device, "cache": cache}
        image_feats = encode_images(model.backbone, data.images, batch_size=batch_size, **encode)
        scored = task_type(task).scored_inputs(model, data, image_feats, **encode)
    finally:
        model.train(was_training)
    return EncodedSplit(task=task, image_feats=scored.image_feats, text_feats=scored.text_feats,
                        head=scored.head, targets=scored.targets, num_folds=num_folds,
                        precision=precision)


def evaluate_split(model: VACSRModel, data, *, task: str, device, batch_size: int = 128,
                   autocast=nullcontext, precision: str = "auto", scorer=None,
                   cache: PrefixCache | None = None, **engine_kwargs) -> dict[str, float]:
    """Encode a split, then score it with the evaluation engine (chunked scorer, or the Ray
    EvalPool passed as `scorer`). Retrieval: R@K both ways, RSUM (COCO 1K / ECCV / CxC when the
    ids say COCO test; semantic mAP@R / R-P / R@1, sem_*, when the data has image_groups);
    classification: accuracy. Both with sigma_hat of the top-1 item."""
    was_training = model.training
    encoded = encode_split(model, data, task=task, batch_size=batch_size, autocast=autocast,
                           keep_on_device=True, precision=precision, cache=cache)
    model.eval()  # the head scores in eval mode
    try:
        return score_encoded(encoded, scorer=scorer, device=device, **engine_kwargs)
    finally:
        model.train(was_training)


# a view of a checkpoint's evaluation: (data.dataset, data.subsample_classes), None for the
# config's own
View = tuple[str | None, str | None]
OWN_DATA: tuple[View, ...] = ((None, None),)


def encode_checkpoint(config, checkpoint_path, *, dataset: str | None = None,
                      subsample: str | None = None, split: str = "test",
                      device=None) -> EncodedSplit:
    """Load a checkpoint, encode `split` of `dataset` (default: the config's) with the eval
    transform; `subsample` picks base / novel / all classes of a classification dataset. On
    `device` (default: the config's train.device) in the run's precision, so the metrics are the
    ones its end-of-epoch evaluation computes."""
    [encoded] = encode_views(config, checkpoint_path, ((dataset, subsample),), split=split,
                             device=device)
    return encoded


@torch.no_grad()
def encode_views(config, checkpoint_path, views: tuple[View, ...] = OWN_DATA, *,
                 split: str = "test", device=None) -> list[EncodedSplit]:
    """encode_checkpoint of each view (dataset, subsample) in order, the model built and the
    checkpoint loaded once for all: a final seed's test split and its extra evaluations (the
    novel classes, the four ImageNet shifts)."""
    from vacsr.compute_device import resolve_device
    from vacsr.methods.build import build_model
    from vacsr.methods.registry import method_of
    from vacsr.train.checkpoint import check_same_architecture, load_checkpoint, load_model_state
    from vacsr.train.precision import run_precision

    device = torch.device(device) if device is not None else resolve_device(config.train.device)
    precision = run_precision(device, config.train)
    state = load_checkpoint(checkpoint_path, device)
    check_same_architecture(checkpoint_path, state, config)  # before the data is read
    method_of(config.adapter.kind).check_task(config.data.task)  # every view's task
    parts = []
    for dataset, subsample in views:  # every view's data checked before the model is built
        data = replace(config.data, dataset=config.data.dataset if dataset is None else dataset,
                       subsample_classes=config.data.subsample_classes if subsample is None
                       else subsample)
        splits = task_type(data.task).build_splits(data, config.train.seed)
        if split not in splits:
            raise DataError(f"{data.dataset}: no {split!r} split (has: {', '.join(splits)})")
        parts.append((data, splits[split]))
    model = build_model(config).to(device).eval()
    load_model_state(model, state, checkpoint_path, config)
    trained_head, seen = model.head, trained_classes(state, config)
    encoded = [_encode_view(model, trained_head, data, part, split, seen, config, precision)
               for data, part in parts]
    for view in encoded:  # after every view: the heads may be the model's own
        view.head = view.head.cpu().eval()
    return encoded


def _encode_view(model, trained_head, data, part, split: str, seen: tuple[str, str], config,
                 precision) -> EncodedSplit:
    """One view's split through the loaded model, with the trained head, or for a class set
    other than the run's the head its method scores unseen classes with (vacsr/methods/)."""
    model.head = trained_head
    if (data.dataset, data.subsample_classes) != seen:
        model.head = model.method.unseen_head(trained_head, part)
    kind = task_type(data.task)
    encoded = encode_split(model, part, task=data.task,
                           batch_size=max(config.train.batch_size, 64), autocast=precision,
                           num_folds=kind.num_folds(split, len(part.images)),
                           precision=precision.scorer, cache=(cache := open_cache(config.data)))
    if cache is not None:
        counts = cache.stats.as_metrics()
        encoded.cache_served = int(counts["prefix_cache/served"])
        encoded.cache_evaluated = int(counts["prefix_cache/evaluated"])
        encoded.cache_rebuilt = tuple(cache.stats.rebuilt)
    encoded.image_feats = encoded.image_feats.float().cpu()
    encoded.text_feats = encoded.text_feats.float().cpu()
    return encoded


def trained_classes(state: dict, config) -> tuple[str, str]:
    """(data.dataset, data.subsample_classes) a checkpoint's run trained on: its stored config's,
    since `vacsr eval` names the evaluated classes by overriding that config; the config's where
    the checkpoint stores none."""
    stored = state.get("config")
    trained = stored.get("data") if isinstance(stored, dict) else None
    if isinstance(trained, dict) and {"dataset", "subsample_classes"} <= trained.keys():
        return trained["dataset"], trained["subsample_classes"]
    return config.data.dataset, config.data.subsample_classes


def score_encoded(encoded: EncodedSplit, *, scorer=None, device=None,
                  **engine_kwargs) -> dict[str, float]:
    """The split's metrics from its features (scorer: a ChunkedScorer or an EvalPool)."""
    engine_kwargs.setdefault("precision", encoded.precision)
    return task_type(encoded.task).score(encoded, scorer=scorer, device=device, **engine_kwargs)


def evaluate_checkpoint(config, checkpoint_path, *, dataset: str | None = None,
                        subsample: str | None = None, split: str = "test", device=None,
                        scorer=None, **engine_kwargs) -> dict[str, float]:
    """Metrics of a trained checkpoint on a split: its own test split, the novel classes of a
    base-to-novel dataset (zero-shot: prompts of classes never trained on), or an ImageNet
    variant. `scorer`: an EvalPool to score on the evaluation actors (default: in process)."""
    encoded = encode_checkpoint(config, checkpoint_path, dataset=dataset, subsample=subsample,
                                split=split, device=device)
    return score_encoded(encoded, scorer=scorer, device=device, **engine_kwargs)
