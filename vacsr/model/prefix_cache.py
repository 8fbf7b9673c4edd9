"""The frozen prefix's outputs of evaluation passes, computed once and kept on disk.

A tower's frozen prefix (the backbone's `frozen_depth`, vacsr/model/frozen.py: the blocks below
the last N trainable ones, or the whole tower when none trains) gives on the deterministic
evaluation transform a constant of each image (vacsr/model/prefix.py): one val pass computes
it, every later epoch, trial and final seed reading that split with that prefix loads it and
runs only the rest of the tower. Training passes (random
augmentation) are never cached.

A file holds one split of one tower: `<folder>/<tower>-<key>.pt`, the key a digest of all the
prefix depends on: the bytes of every parameter and buffer the prefix reads (prefix.py's
`prefix_tensors`: the stem and the first `depth` blocks), the tower,
the model, the inputs (each image's path, size and mtime; each text's token ids), the
evaluation transform, the precision, the device type and the torch / open_clip versions. It is
written to a temporary name then renamed (runs that share the folder replace each other with
whole files) and verified when read: a file that does not load, or whose tensor does not match
the digest written with it, is rebuilt with a one-line notice and never used; the notice is also
kept in `stats.rebuilt`, which a sweep's trials and final evaluations bring to its console.

A split whose prefix outputs would exceed `budget_gib` (they are held in memory while a pass
reads them) is evaluated without the cache, said once per split.
"""
from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import open_clip
import torch

from vacsr.atomic import atomic_write
from vacsr.model import prefix as tower_prefix
from vacsr.results import PREFIX_CACHE_REBUILT

FORMAT = 2  # bump when the file's layout changes: older files then miss


def _note(text: str) -> None:
    print(f"vacsr: note: prefix cache: {text}", file=sys.stderr, flush=True)


def tensor_digest(tensor: torch.Tensor) -> str:
    """blake2b of a tensor's bytes (any dtype)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.blake2b(memoryview(flat.numpy()), digest_size=16).hexdigest()


def prefix_weights_digest(backbone, tower: str, depth: int) -> str:
    """Digest of every parameter and buffer the prefix of `depth` blocks reads (named by
    vacsr/model/prefix.py's `prefix_tensors`)."""
    sha = hashlib.sha256()
    for name, value in tower_prefix.prefix_tensors(backbone, tower, depth):
        sha.update(name.encode())
        sha.update(tensor_digest(value).encode())
    return sha.hexdigest()


def image_inputs_digest(images: Sequence) -> str | None:
    """Digest of the images' paths, sizes and mtimes; None when one is not a file path (an
    in-memory image has no identity to key a file by)."""
    sha = hashlib.sha256()
    for ref in images:
        if not isinstance(ref, (str, os.PathLike)):
            return None
        stat = os.stat(ref)
        sha.update(f"{os.fspath(ref)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return sha.hexdigest()


@dataclass
class CacheStats:
    """Inputs of evaluation passes: served from a cache file, computed and stored, or encoded
    without the cache (over budget, or not cacheable)."""

    served: int = 0
    stored: int = 0
    uncached: int = 0
    rebuilt: list[str] = field(default_factory=list)  # a line per damaged file found, rebuilt

    def as_metrics(self) -> dict[str, float]:
        return {"prefix_cache/served": float(self.served),
                "prefix_cache/evaluated": float(self.served + self.stored + self.uncached)}

    def rebuilt_note(self) -> dict[str, str]:
        """{PREFIX_CACHE_REBUILT: the damaged files' lines} for a Ray report, or {}: the
        worker's log is not the sweep's console (vacsr/sweep/search/tune.py shows them)."""
        return {PREFIX_CACHE_REBUILT: "\n".join(self.rebuilt)} if self.rebuilt else {}


@dataclass
class PrefixCache:
    folder: Path
    budget_gib: float = 4.0
    stats: CacheStats = field(default_factory=CacheStats)
    _said: set = field(default_factory=set)

    def path(self, tower: str, key: str) -> Path:
        return self.folder / f"{tower}-{key[:40]}.pt"

    def key(self, backbone, tower: str, depth: int, inputs: str, precision: str,
            device: torch.device) -> str:
        parts = [f"format={FORMAT}", f"model={getattr(backbone, 'name', '')}", f"tower={tower}",
                 f"depth={depth}", f"compact={tower_prefix.compact(backbone, tower, depth)}",
                 f"weights={prefix_weights_digest(backbone, tower, depth)}", f"inputs={inputs}",
                 f"transform={backbone.eval_transform!r}" if tower == "image" else "",
                 f"precision={precision}", f"device={device.type}",
                 f"torch={torch.__version__}", f"open_clip={open_clip.__version__}"]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    def load(self, path: Path, key: str, count: int) -> torch.Tensor | None:
        """The cached prefix outputs, or None (missing; damaged: said and removed)."""
        if not path.is_file():
            return None
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            tokens = saved["tokens"]
            if saved.get("key") != key or tokens.shape[0] != count:
                raise ValueError("written for other inputs")
            if tensor_digest(tokens) != saved.get("digest"):
                raise ValueError("its content does not match its digest")
        except Exception as exc:  # any damage: truncated, random bytes, another layout
            why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            self.stats.rebuilt.append(f"{path} is damaged ({why}); rebuilt")
            _note(f"{path} is damaged ({why}); rebuilding it")
            path.unlink(missing_ok=True)
            return None
        return tokens

    def save(self, path: Path, key: str, tokens: torch.Tensor) -> None:
        record = {"key": key, "digest": tensor_digest(tokens), "tokens": tokens}
        atomic_write(path, lambda tmp: torch.save(record, tmp))

    def within_budget(self, label: str, count: int, per_input: int) -> bool:
        total = count * per_input
        if total <= self.budget_gib * 2**30:
            return True
        if label not in self._said:
            self._said.add(label)
            _note(f"{label}: {per_input:,} B per input x {count:,} inputs = "
                  f"{total / 2**30:.2f} GiB exceeds data.prefix_cache_gib "
                  f"({self.budget_gib:g}); evaluated without the cache")
        return False

    def prefix_outputs(self, backbone, tower: str, depth: int, inputs: str, count: int,
                       batches: Callable, precision: str,
                       device: torch.device) -> torch.Tensor | None:
        """The (N, L, W) prefix outputs of `count` inputs (`inputs`: their digest) on the CPU:
        read from the cache, or computed from `batches()` (the prefix's outputs batch by batch,
        in order) and stored; None when they exceed the budget (the caller then encodes without
        the cache)."""
        key = self.key(backbone, tower, depth, inputs, precision, device)
        path = self.path(tower, key)
        tokens = self.load(path, key, count)
        if tokens is not None:
            self.stats.served += count
            return tokens
        chunks = []
        for chunk in batches():
            per_input = chunk[0].numel() * chunk.element_size()
            if not chunks and not self.within_budget(f"{tower} split {key[:12]}", count,
                                                     per_input):
                self.stats.uncached += count
                return None
            chunks.append(chunk.cpu())
        tokens = torch.cat(chunks)  # (N, L, W)
        self.save(path, key, tokens)
        self.stats.stored += count
        _note(f"stored {count:,} {tower} inputs x {per_input:,} B = "
              f"{count * per_input / 2**20:,.1f} MiB in {path}")
        return tokens


def open_cache(data_config) -> PrefixCache | None:
    """The run's cache (data.prefix_cache_dir), or None."""
    if not data_config.prefix_cache_dir:
        return None
    return PrefixCache(Path(data_config.prefix_cache_dir), data_config.prefix_cache_gib)
