"""What a run read, as a fingerprint: each split's records (image paths relative to the folder
that holds them, labels, captions) hashed, so two runs can be told to have used the same data.

The tracking layer builds a run's splits and logs these as MLflow dataset inputs
(vacsr/records/inputs.py); nothing here imports MLflow or the tasks.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Union

from vacsr.data.base import ClassificationData, RetrievalData

Split = Union[ClassificationData, RetrievalData]
DIGEST_CHARS = 16  # of the sha256 hex digest; MLflow stores up to 36


@dataclass(frozen=True)
class SplitFingerprint:
    split: str  # "train" | "val" | "test"
    source: str  # the folder holding the split's images (absolute)
    digest: str
    items: int  # images (classification) or image-caption pairs (retrieval)
    classes: int | None = None


def _paths(split: Split) -> list[str]:
    """Each image's path, or for an in-memory image a hash of its pixels."""
    return [os.fspath(image) if isinstance(image, (str, os.PathLike))
            else f"<in-memory {hashlib.sha1(image.tobytes()).hexdigest()}>"
            for image in split.images]


def _source(paths: list[str]) -> str:
    files = [p for p in paths if not p.startswith("<in-memory")]
    if not files:
        return "<in-memory>"
    folder = os.path.commonpath([os.path.dirname(p) for p in files])
    return os.path.abspath(folder)


def fingerprint(name: str, split: Split) -> SplitFingerprint:
    """sha256 over the split's records in order, image paths relative to `source`."""
    paths = _paths(split)
    source = _source(paths)
    relative = [os.path.relpath(p, source) if source != "<in-memory>" and not
                p.startswith("<in-memory") else p for p in paths]
    sha = hashlib.sha256()
    if isinstance(split, ClassificationData):
        sha.update("\n".join(split.classnames).encode() + b"\0")
        for path, label in zip(relative, split.labels):
            sha.update(f"{path}\t{label}\n".encode())
        return SplitFingerprint(name, source, sha.hexdigest()[:DIGEST_CHARS], len(split.labels),
                                len(split.classnames))
    for path in relative:
        sha.update(f"{path}\n".encode())
    sha.update(b"\0")
    for caption, image in zip(split.captions, split.caption_to_image):
        sha.update(f"{image}\t{caption}\n".encode())
    return SplitFingerprint(name, source, sha.hexdigest()[:DIGEST_CHARS], len(split.captions))


def fingerprints(splits: dict[str, Split]) -> list[SplitFingerprint]:
    """One fingerprint per split, in the splits' order."""
    return [fingerprint(name, split) for name, split in splits.items()]
