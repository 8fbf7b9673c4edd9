"""Feature cache: encode a dataset once with a frozen backbone, store features + ids in Parquet.

Adapter-only trials (frozen backbone, only the variational adapter trains) then read an (N, d)
float32 matrix instead of decoding, transforming and encoding every image in every trial.

A cache entry is keyed by everything that changes the features: the model name, the weights'
identity (open_clip tag; or local file path + size + mtime; or, for random init, a hash of the
parameters), the preprocessing (the transform pipeline's description), the feature kind (pooled, or
GPO with a hash of its parameters), the tokenizer for texts, and the content (image paths with size
and mtime, or pixels; texts; ids). The key's hash is part of the file name, so a changed key builds
a new entry and an unchanged one is reused; files are written to a temporary name and renamed.
"""
from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image

from vacsr.data.base import ClassificationData, RetrievalData
from vacsr.data.files import atomic_write_bytes
from vacsr.data.encoding import encode_images, encode_texts

KEY_FIELD = b"vacsr.cache_key"
IDENTITY_FIELD = b"vacsr.identity"


@dataclass(frozen=True)
class CachedFeatures:
    features: np.ndarray  # (N, d) float32, L2-normalised as the backbone returns them
    ids: np.ndarray  # (N,) int64: image / caption ids, or item indices
    labels: np.ndarray | None  # (N,) int64 for classification images
    path: Path
    built: bool  # True when encoded by this call, False when read from disk


# ---------------------------------------------------------------- identity of the encoder
def describe_transform(transform: Callable) -> str:
    """A stable text for a transform pipeline (function reprs carry memory addresses)."""
    parts = getattr(transform, "transforms", [transform])
    lines = []
    for part in parts:
        if inspect.isfunction(part) or inspect.ismethod(part):
            lines.append(f"{part.__module__}.{part.__qualname__}")
        else:
            lines.append(re.sub(r" at 0x[0-9a-f]+", "", repr(part)))
    return "; ".join(lines)


def tensor_hash(module: torch.nn.Module) -> str:
    """Hash of every parameter and buffer (dtype-agnostic: bytes of the raw storage)."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        data = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


def weights_identity(pretrained: str | None, module: torch.nn.Module) -> str:
    """open_clip tag, local file (path, size, mtime) or, for random init, a parameter hash."""
    if not pretrained:
        return f"params:{tensor_hash(module)}"
    path = Path(pretrained).expanduser()
    if path.is_file():
        stat = path.stat()
        return f"file:{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return f"tag:{pretrained}"


def backbone_identity(backbone, *, name: str, pretrained: str | None) -> dict[str, str]:
    """The cache-key fields of a ClipBackbone built from (name, pretrained)."""
    features = "pooled"
    if getattr(backbone, "use_gpo", False):
        features = f"gpo:{tensor_hash(backbone.image_gpo)}:{tensor_hash(backbone.text_gpo)}"
    tokenizer = backbone.tokenizer
    return {"model": name, "weights": weights_identity(pretrained, backbone.clip),
            "preprocess": describe_transform(backbone.eval_transform), "features": features,
            "tokenizer": f"{type(tokenizer).__name__}:{getattr(tokenizer, 'context_length', '')}",
            "precision": "fp32"}


def content_fingerprint(kind: str, refs: Sequence, ids: Sequence[int]) -> str:
    """Hash of what is encoded: file path + size + mtime (so regenerated files rebuild), pixels of
    in-memory images, or the texts; plus the ids stored alongside."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(kind.encode())
    for ref in refs:
        if isinstance(ref, Image.Image):
            digest.update(ref.tobytes())
        elif kind == "text":
            digest.update(str(ref).encode() + b"\0")
        else:
            stat = os.stat(ref) if os.path.exists(ref) else None
            stamp = f"{stat.st_size}:{stat.st_mtime_ns}" if stat else "missing"
            digest.update(f"{ref}|{stamp}\0".encode())
    digest.update(np.asarray(ids, dtype=np.int64).tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------- the Parquet store
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _table(features: np.ndarray, ids: np.ndarray, labels: np.ndarray | None,
           metadata: dict[bytes, bytes]) -> pa.Table:
    features = np.ascontiguousarray(features, dtype=np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), features.shape[1])
    columns = {"id": pa.array(np.asarray(ids, dtype=np.int64)), "feature": column}
    if labels is not None:
        columns["label"] = pa.array(np.asarray(labels, dtype=np.int64))
    return pa.table(columns).replace_schema_metadata(metadata)


class FeatureCache:
    """Parquet files `<cache_dir>/<name>-<key hash>.parquet`, one per (encoder, content)."""

    def __init__(self, cache_dir: str | Path, identity: Mapping[str, str]) -> None:
        self.cache_dir = Path(cache_dir)
        self.identity = dict(identity)

    def key(self, name: str, content: str) -> str:
        text = json.dumps({"identity": self.identity, "name": name, "content": content},
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def path(self, name: str, content: str) -> Path:
        return self.cache_dir / f"{_safe(name)}-{self.key(name, content)[:16]}.parquet"

    def load(self, name: str, content: str) -> CachedFeatures | None:
        """The stored entry, or None when absent, unreadable or made under another key."""
        path = self.path(name, content)
        try:
            table = pq.read_table(path, memory_map=True)
        except (OSError, pa.ArrowException):
            return None  # derived data: a damaged file is simply rebuilt
        if (table.schema.metadata or {}).get(KEY_FIELD) != self.key(name, content).encode():
            return None
        column = table.column("feature").combine_chunks()
        width = column.type.list_size
        # writable copies: callers turn these into torch tensors, which must not alias the mmap
        features = column.flatten().to_numpy(zero_copy_only=False, writable=True)
        labels = (table.column("label").to_numpy().copy() if "label" in table.column_names
                  else None)
        return CachedFeatures(features.reshape(-1, width), table.column("id").to_numpy().copy(),
                              labels, path, built=False)

    def save(self, name: str, content: str, features: np.ndarray, ids: Sequence[int],
             labels: Sequence[int] | None = None) -> CachedFeatures:
        path = self.path(name, content)
        metadata = {KEY_FIELD: self.key(name, content).encode(),
                    IDENTITY_FIELD: json.dumps(self.identity, sort_keys=True).encode()}
        labels_array = None if labels is None else np.asarray(labels, dtype=np.int64)
        buffer = io.BytesIO()
        pq.write_table(_table(features, np.asarray(ids), labels_array, metadata), buffer)
        atomic_write_bytes(path, buffer.getvalue())
        return CachedFeatures(np.asarray(features, dtype=np.float32),
                              np.asarray(ids, dtype=np.int64), labels_array, path, built=True)

    def get_or_build(self, name: str, content: str, encode: Callable[[], np.ndarray],
                     ids: Sequence[int], labels: Sequence[int] | None = None) -> CachedFeatures:
        cached = self.load(name, content)
        if cached is not None:
            return cached
        return self.save(name, content, encode(), ids, labels)


def image_features(cache: FeatureCache, backbone, images: Sequence, ids: Sequence[int], *,
                   name: str, labels: Sequence[int] | None = None, batch_size: int = 256,
                   num_workers: int = 0) -> CachedFeatures:
    content = content_fingerprint("image", images, ids)
    return cache.get_or_build(
        name, content, lambda: encode_images(backbone, images, batch_size=batch_size,
                                             num_workers=num_workers).numpy(), ids, labels)


def text_features(cache: FeatureCache, backbone, texts: Sequence[str], ids: Sequence[int], *,
                  name: str, batch_size: int = 1024) -> CachedFeatures:
    content = content_fingerprint("text", texts, ids)
    return cache.get_or_build(
        name, content, lambda: encode_texts(backbone, texts, batch_size=batch_size).numpy(), ids)


def cache_classification(cache: FeatureCache, backbone, data: ClassificationData, name: str,
                         **kwargs) -> tuple[CachedFeatures, CachedFeatures]:
    """(image features with labels, prompt features by class) of one classification split."""
    images = image_features(cache, backbone, data.images, list(range(len(data.images))),
                            name=f"{name}-images", labels=data.labels, **kwargs)
    prompts = text_features(cache, backbone, data.prompts(), list(range(len(data.classnames))),
                            name=f"{name}-prompts")
    return images, prompts


def cache_retrieval(cache: FeatureCache, backbone, data: RetrievalData, name: str,
                    **kwargs) -> tuple[CachedFeatures, CachedFeatures]:
    """(image features keyed by image id, caption features keyed by caption id)."""
    image_ids = data.image_ids or list(range(len(data.images)))
    caption_ids = data.caption_ids or list(range(len(data.captions)))
    images = image_features(cache, backbone, data.images, image_ids, name=f"{name}-images",
                            **kwargs)
    captions = text_features(cache, backbone, data.captions, caption_ids, name=f"{name}-captions")
    return images, captions
