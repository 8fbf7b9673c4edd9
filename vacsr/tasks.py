"""Tasks: turn a batch into (loss, dict of named parts) and score (queries x items) blocks, and
own every step that differs between retrieval and classification (splits, training dataset and
collate, text encoding, scoring), so the trainer and the evaluation ask the task instead of
branching on `data.task`.

A loss is split into `features` (per-rank work: the backbone on the local batch) and
`loss_from_pairs` (needs every pair of the global batch), so a distributed trainer can gather the
features of all ranks in between.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NamedTuple

import torch

from vacsr.data import SPLIT_BUILDERS
from vacsr.data.datasets import CaptionPairDataset, LabelledImageDataset
from vacsr.data.fewshot import shots_per_class
from vacsr.errors import ConfigError
from vacsr.eval.evaluate import evaluate_classification, evaluate_retrieval
from vacsr.methods.method import class_prompts
from vacsr.model.cocoop import ScoreRows, conditioned_logits
from vacsr.model.encoding import encode_texts
from vacsr.model.prefix import constant_in_training, text_prefix, text_suffix
from vacsr.model.vacsr import VACSRModel
from vacsr.task_names import SHOTS_MAX_TAG, SHOTS_MIN_TAG, unknown_task

COCO_1K_FOLDS = 5


class CaptionCollate:
    """Stacks images and tokenizes captions in the loader (picklable for worker processes)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, items):
        images, captions, image_index = zip(*items)
        return torch.stack(images), self.tokenizer(list(captions)), torch.tensor(image_index)


@dataclass
class PairBatch:
    """Features of one batch; y_ij = [image_keys[i] == text_keys[j]]."""

    image_feats: torch.Tensor  # (B, d)
    text_feats: torch.Tensor  # (B', d)
    image_keys: torch.Tensor  # (B,) image index (retrieval) or class label (classification)
    text_keys: torch.Tensor  # (B',) image index of each caption, or class index
    text_is_shared: bool = False  # class prompts: identical on every rank, never gathered
    # text_feats (B, C, d): each image's own class features (CoCoOp's conditioned prompts),
    # gathered with the images; the keys stay the shared class index
    text_per_image: bool = False

    def labels(self) -> torch.Tensor:
        return (self.image_keys[:, None] == self.text_keys[None, :]).float()  # (B, B')

    def float(self) -> "PairBatch":
        return replace(self, image_feats=self.image_feats.float(),
                       text_feats=self.text_feats.float())


class ScoredInputs(NamedTuple):
    """What an evaluation pass hands the scorer: query and item features, the head that scores
    them, and what the metrics need."""

    image_feats: torch.Tensor  # (N_i, d)
    text_feats: torch.Tensor  # (N_c, d)
    head: Any
    targets: dict[str, Any]


class _Task:
    def __init__(self, model: VACSRModel, loss_config) -> None:
        self.model = model
        self.loss_config = loss_config

    def loss_from_pairs(self, pairs: PairBatch):
        """All B x B' pairs of the (gathered) batch -> (loss, parts): the method's loss
        (vacsr/methods/)."""
        method = self.model.method
        if method.loss is None:
            raise ConfigError(f"adapter.kind: {method.name} trains nothing; it has no loss")
        return method.loss(self.model.head, pairs.image_feats, pairs.text_feats, pairs.labels(),
                           self.loss_config)

    def loss(self, batch):
        return self.loss_from_pairs(self.features(batch))

    @staticmethod
    def run_tags(data_config, train) -> dict[str, Any]:
        """Tags of what the run's training data turned out to be, beside the config asked."""
        return {}

    def score(self, queries: torch.Tensor, items: torch.Tensor):
        """Inference (logits, sigma_hat) of a (queries x items) block."""
        return self.model.score(queries, items)


class RetrievalTask(_Task):
    """Batch = (images (B,3,H,W), caption token ids (B,T), image index (B,)); a caption is a
    positive of every image in the batch with the same index (duplicates count)."""

    name = "retrieval"
    ranks_items = True  # queries rank a gallery: uncertainty plots, two-stage re-ranking
    build_splits = staticmethod(SPLIT_BUILDERS["retrieval"])
    train_dataset = CaptionPairDataset

    @classmethod
    def for_run(cls, model: VACSRModel, loss_config, splits: dict) -> "RetrievalTask":
        return cls(model, loss_config)

    @staticmethod
    def train_size(data_config, train) -> tuple[int, str, str]:
        """(pairs, what they are, what gives more) of a training split."""
        synthetic = data_config.dataset == "synthetic" and data_config.root is None
        remedy = "more training data (data.num_train)" if synthetic else "more training data"
        return len(train.captions), "image-caption pairs", remedy

    @staticmethod
    def collate(backbone) -> CaptionCollate:
        return CaptionCollate(backbone.tokenizer)

    @staticmethod
    def num_folds(split: str, num_images: int) -> int | None:
        """Folds of the COCO 1K recalls (coco1k_*, paper Tables 1-3): 5 on a test split whose
        images split into 5 equal folds (COCO 5K: 1,000 each); None elsewhere (val stays
        cheap)."""
        if split == "test" and num_images >= COCO_1K_FOLDS and num_images % COCO_1K_FOLDS == 0:
            return COCO_1K_FOLDS
        return None

    @staticmethod
    def scored_inputs(model, data, image_feats: torch.Tensor, **encode) -> ScoredInputs:
        """The split's image features with its caption features (N_c, d), and what the recalls
        need."""
        targets = {"caption_to_image": data.caption_to_image, "image_ids": data.image_ids or None,
                   "caption_ids": data.caption_ids or None, "image_groups": data.image_groups}
        return ScoredInputs(image_feats, encode_texts(model.backbone, data.captions, **encode),
                            model.head, targets)

    @staticmethod
    def score(encoded, *, scorer=None, device=None, **engine_kwargs) -> dict[str, float]:
        """R@K both ways, RSUM (COCO 1K / ECCV / CxC, semantic metrics where the data allows)."""
        if encoded.num_folds and "num_folds" not in engine_kwargs:
            engine_kwargs["num_folds"] = encoded.num_folds
        targets = encoded.targets
        return evaluate_retrieval(encoded.image_feats, encoded.text_feats, encoded.head,
                                  targets["caption_to_image"], targets["image_ids"],
                                  targets["caption_ids"], image_groups=targets["image_groups"],
                                  device=device, scorer=scorer, **engine_kwargs)

    def features(self, batch) -> PairBatch:
        images, tokens, image_index = batch
        return PairBatch(self.model.encode_image(images), self.model.encode_text(tokens),
                         image_index, image_index)


class ClassificationTask(_Task):
    """Batch = (images (B,3,H,W), labels (B,)); the texts are every class prompt, so
    y_ij = [label(i) == j] over a (B, C) block."""

    name = "classification"
    ranks_items = False
    build_splits = staticmethod(SPLIT_BUILDERS["classification"])
    train_dataset = LabelledImageDataset

    @classmethod
    def for_run(cls, model: VACSRModel, loss_config, splits: dict) -> "ClassificationTask":
        train = splits["train"]
        if model.method.class_weights:  # a weight per training class (the linear probe)
            model.head.fit_classes(train.classnames)
        return cls(model, loss_config, model.backbone.tokenize(class_prompts(model, train)))

    @staticmethod
    def train_size(data_config, train) -> tuple[int, str, str]:
        return (len(train.labels), f"images ({data_config.shots} per class)",
                "more shots (data.shots)")

    @staticmethod
    def run_tags(data_config, train) -> dict[str, Any]:
        """The fewest and most images a class trains on: data.shots asks for K, and a class
        with fewer training images trains on all of them (CoOp's sampling), which the config's
        data.shots does not say."""
        fewest, most = shots_per_class(train.labels)
        return {SHOTS_MIN_TAG: fewest, SHOTS_MAX_TAG: most}

    @staticmethod
    def collate(backbone) -> None:
        return None  # the loader's default stacking: (images, labels)

    @staticmethod
    def num_folds(split: str, num_images: int) -> None:
        return None

    @staticmethod
    def scored_inputs(model, data, image_feats: torch.Tensor, **encode) -> ScoredInputs:
        """The split's image features with one prompt feature per class (C, d), the method's
        prompts (vacsr/methods/), and the labels. Prompts whose context the head learns go
        through it whole, uncached. Prompts conditioned on each image (CoCoOp) are scored here,
        where the text tower is: each image's class logits (N, C), read back by a head that
        picks their columns."""
        prompts, targets = class_prompts(model, data), {"labels": data.labels}
        if model.method.conditions_prompts:
            logits = conditioned_logits(model.head, model.backbone,
                                        model.backbone.tokenize(prompts), image_feats,
                                        encode.get("autocast", nullcontext))  # (N, C)
            return ScoredInputs(logits, torch.eye(len(prompts), device=logits.device),
                                ScoreRows(), targets)
        if model.method.encodes_prompts:
            encode["encoder"] = partial(model.head.encode_prompts, model.backbone)
        return ScoredInputs(image_feats, encode_texts(model.backbone, prompts, **encode),
                            model.head, targets)

    @staticmethod
    def score(encoded, *, scorer=None, device=None, **engine_kwargs) -> dict[str, float]:
        """Accuracy (with sigma_hat of the top-1 class)."""
        return evaluate_classification(encoded.image_feats, encoded.text_feats, encoded.head,
                                       encoded.targets["labels"], device=device, scorer=scorer,
                                       precision=engine_kwargs.get("precision", "auto"))

    def __init__(self, model: VACSRModel, loss_config, prompt_tokens: torch.Tensor) -> None:
        super().__init__(model, loss_config)
        self.prompt_tokens = prompt_tokens  # (C, T)
        self._frozen_text: torch.Tensor | None = None
        # batches hold image features, not images (a frozen image tower's, computed once:
        # vacsr/train/loop.py Trainer.feature_dataset)
        self.image_features_given = False
        self._text_prefix: torch.Tensor | None = None  # the prompts' frozen prefix output

    def text_trainable(self) -> bool:
        """A text block trains, or a deep method's head acts inside the text tower (its
        parameters learn through every prompt, each step)."""
        backbone = self.model.backbone
        return "text" in backbone.hooks or any(
            p.requires_grad for name, p in backbone.named_parameters()
            if not name.startswith(("clip.visual.", "image_gpo.")))

    def learned_prompts(self) -> bool:
        """The head learns the prompts' context (CoOp): the class features change every step."""
        return self.model.method.encodes_prompts

    def class_features(self, device) -> torch.Tensor:
        """(C, d) prompt features: computed once when the text tower is frozen; when it has a
        frozen prefix (vacsr/model/frozen.py), the prefix's output once and the rest every step
        (with no text block training, the prefix is the whole trunk and only ln_final and the
        projection run per step: the default of few-shot runs); all of it every step otherwise
        (hundreds of prompts through the blocks per step are the cost otherwise)."""
        tokens = self.prompt_tokens.to(device)
        backbone = self.model.backbone
        if self.learned_prompts():  # every prompt through the frozen tower, to the context
            return self.model.head.encode_prompts(backbone, tokens)
        if not self.text_trainable():
            if self._frozen_text is None or self._frozen_text.device != torch.device(device):
                with torch.no_grad():
                    self._frozen_text = self.model.encode_text(tokens)
            return self._frozen_text
        depth = backbone.frozen_depth("text")
        if not depth or not constant_in_training(backbone, "text", depth):
            return self.model.encode_text(tokens)
        if self._text_prefix is None or self._text_prefix.device != torch.device(device):
            with torch.no_grad():
                self._text_prefix = text_prefix(backbone, tokens, depth)  # (C, T or 1, W)
        return text_suffix(backbone, self._text_prefix, tokens, depth)

    def features(self, batch) -> PairBatch:
        images, labels = batch  # (B, 3, H, W), or (B, d) features already
        class_index = torch.arange(self.prompt_tokens.shape[0], device=images.device)
        image_feats = images if self.image_features_given else self.model.encode_image(images)
        if self.model.method.conditions_prompts:  # each image's own class features
            text_feats = self.model.head.encode_conditioned(
                self.model.backbone, self.prompt_tokens.to(images.device), image_feats)
            return PairBatch(image_feats, text_feats, labels, class_index, text_per_image=True)
        return PairBatch(image_feats, self.class_features(images.device), labels, class_index,
                         text_is_shared=True)


TASKS = {task.name: task for task in (RetrievalTask, ClassificationTask)}


def task_type(name: str) -> type[RetrievalTask] | type[ClassificationTask]:
    """The task class `data.task` names."""
    try:
        return TASKS[name]
    except KeyError:
        raise unknown_task(name) from None
