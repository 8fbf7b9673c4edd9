"""Few-shot sampling and the base/novel class split of the CoOp / CoCoOp / MaPLe protocol.

Reproduces Dassl's `generate_fewshot_dataset` and CoOp's `OxfordPets.subsample_classes` exactly
(CoOp's protocol, paper appendix C.1): with the run seed, items are grouped by label in order
of first occurrence, `random.sample(items, K)` is drawn per class (all items if fewer), train
first and then val with min(K, 4) shots from the same generator. `random.Random(seed)` yields
the same stream as `random.seed(seed)` followed by module-level calls, without touching global
state.

The sample is cached as `split_fewshot/shot_{K}-seed_{S}.pkl` in the dataset folder with paths
relative to that folder, so the cache survives moving the data. Where the dataset folder cannot be
written (shared data mounted read-only) it goes to `$VACSR_CACHE_DIR/fewshot/<dataset>-<hash of
its path>/` (default `~/.cache/vacsr/fewshot/...`), as the folder listing cache does. Caches
written by CoOp-family code (pickled `dassl` Datum objects with absolute paths) are read too,
without importing dassl.
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import pickle
import pickletools
import random
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterable, Protocol, Sequence, runtime_checkable

from vacsr.data.checked_io import atomic_pickle
from vacsr.errors import DataError, StorageError

# {"format", "sha256", "items": pickled {"train", "val"}}: the checksum turns a damaged file into
# one line before its items are unpickled (format 1, the items unwrapped, is still read)
CACHE_FORMAT = "vacsr-fewshot/2"
VAL_MAX_SHOTS = 4


@dataclass(frozen=True)
class Item:
    """One labelled image; `path` is relative to the dataset folder, '/'-separated."""

    path: str
    label: int
    classname: str


@runtime_checkable
class GroupedItems(Protocol):
    """A split that knows its classes without iterating its items (folder_items.FolderItems:
    ImageNet's 1.28M training images, built only when read)."""

    def groups(self) -> dict[int, Sequence[Item]]: ...

    def labels(self) -> set[int]: ...

    def has(self, path: str, label: int) -> bool: ...

    def without(self, paths: set[str]) -> Sequence[Item]: ...


def label_set(items: Sequence[Item]) -> set[int]:
    return items.labels() if isinstance(items, GroupedItems) else {item.label for item in items}


def group_by_label(items: Sequence[Item]) -> dict[int, Sequence[Item]]:
    """Label -> items, labels in order of first occurrence (as Dassl's defaultdict iterates)."""
    if isinstance(items, GroupedItems):
        return items.groups()
    groups: dict[int, list[Item]] = defaultdict(list)
    for item in items:
        groups[item.label].append(item)
    return groups


def shots_per_class(labels: Iterable[int]) -> tuple[int, int]:
    """(fewest, most) images of one class among `labels`: what a K-shot sample gave each class
    (K, or all of a class's images where it has fewer, as CoOp samples); (0, 0) for none."""
    counts = Counter(labels).values()
    return (min(counts), max(counts)) if counts else (0, 0)


def sample_few_shot(items: Sequence[Item], shots: int, rng: random.Random) -> list[Item]:
    """K items per class drawn with `rng.sample`; classes with fewer items keep them all."""
    output: list[Item] = []
    for group in group_by_label(items).values():
        output.extend(rng.sample(group, shots) if len(group) >= shots else group)
    return output


def sample_train_val(train: Sequence[Item], val: Sequence[Item], shots: int,
                     seed: int) -> tuple[list[Item], list[Item]]:
    """The protocol's draw: train with K shots, then val with min(K, 4), one seeded stream."""
    rng = random.Random(seed)
    few_train = sample_few_shot(train, shots, rng)
    few_val = sample_few_shot(val, min(shots, VAL_MAX_SHOTS), rng)
    return few_train, few_val


def val_from_remaining_train(train: Sequence[Item], few_train: Sequence[Item], shots: int,
                             seed: int) -> list[Item]:
    """Few-shot val for datasets without a val split (ImageNet).

    CoOp evaluates ImageNet's "val" on the test set; selecting on test would leak it, so val is
    min(K, 4) per class from the train images not in the few-shot train set. A fresh generator
    seeded with the run seed makes it independent of who wrote the cached train sample.
    """
    chosen = {item.path for item in few_train}
    remaining = (train.without(chosen) if isinstance(train, GroupedItems)
                 else [item for item in train if item.path not in chosen])
    return sample_few_shot(remaining, min(shots, VAL_MAX_SHOTS), random.Random(seed))


def fewshot_path(dataset_dir: Path, shots: int, seed: int) -> Path:
    return dataset_dir / "split_fewshot" / f"shot_{shots}-seed_{seed}.pkl"


def fallback_fewshot_path(dataset_dir: Path, shots: int, seed: int) -> Path:
    """Where the cache goes when the dataset folder is read-only: one folder per dataset path."""
    base = os.environ.get("VACSR_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "vacsr"
    digest = hashlib.sha256(str(Path(dataset_dir).resolve()).encode()).hexdigest()[:16]
    return root / "fewshot" / f"{dataset_dir.name}-{digest}" / f"shot_{shots}-seed_{seed}.pkl"


# ---------------------------------------------------------------- cache reading and writing
class _DatumShim:
    """Stands in for dassl's Datum when unpickling CoOp caches; keeps the attribute dict."""

    def __setstate__(self, state) -> None:
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(f"a Datum's state is a {type(state).__name__}, not a dict")
        self.__dict__.update(state)


class _CacheUnpickler(pickle.Unpickler):
    """Refuse every class but dassl's Datum: a cache file must not be able to run code."""

    def find_class(self, module: str, name: str):
        if module.startswith("dassl") and name == "Datum":
            return _DatumShim
        raise pickle.UnpicklingError(f"unexpected object {module}.{name}")


def _relative_to_dataset(path, folder_name: str, source: Path) -> str:
    """CoOp stores absolute paths: keep what follows the last `<dataset folder>` component."""
    parts = PurePosixPath(path.replace("\\", "/")).parts if isinstance(path, str) else ()
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] == folder_name:
            return "/".join(parts[index + 1:])
    raise DataError(f"{source}: cached path {path!r} is not inside a {folder_name!r} folder; "
                    "expected paths under the dataset folder")


def _to_items(entries, folder_name: str, source: Path) -> list[Item]:
    if not isinstance(entries, (list, tuple)):
        raise DataError(f"{source}: few-shot cache holds a {type(entries).__name__} where a list "
                        f"of items belongs; {_RESAMPLE}")
    items = []
    for entry in entries:
        if isinstance(entry, _DatumShim):
            state = entry.__dict__
            entry = (_relative_to_dataset(state.get("_impath", ""), folder_name, source),
                     state.get("_label"), state.get("_classname"))
        if not (isinstance(entry, (tuple, list)) and len(entry) == 3 and isinstance(entry[0], str)
                and type(entry[1]) is int and isinstance(entry[2], str)):
            raise DataError(f"{source}: cache entry {_short(entry)} is malformed; expected "
                            "(relative path, integer label, class name)")
        items.append(Item(entry[0], entry[1], entry[2]))
    return items


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


_MEMO_OPS = {"PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET"}


def _check_opcodes(payload: bytes) -> None:
    """Walk the pickle's opcodes without building anything (pickletools reads lengths against
    what is left, allocating nothing): raise ValueError for a truncated stream or a memo index no
    pickle of this size can hold."""
    for opcode, arg, _ in pickletools.genops(payload):
        if opcode.name in _MEMO_OPS and not 0 <= int(arg) <= len(payload):
            raise ValueError(f"memo index {arg} beyond a {len(payload)}-byte pickle")


def _decode(payload: bytes):
    """The unpickled cache. vacsr's own files are a small wrapper, checked opcode by opcode
    (cheap: a dozen opcodes), around the items, unpickled at C speed once their checksum holds;
    CoOp's files and format 1 are the items themselves, checked opcode by opcode (slower)."""
    _check_opcodes(payload)
    data = _CacheUnpickler(io.BytesIO(payload)).load()
    if isinstance(data, dict) and data.get("format") == CACHE_FORMAT:
        items = data.get("items")
        if not isinstance(items, bytes) or hashlib.sha256(items).hexdigest() != data.get("sha256"):
            raise ValueError("checksum mismatch: the file is damaged")
        data = _CacheUnpickler(io.BytesIO(items)).load()
    return data


_RESAMPLE = "expected a pickled {'train': [...], 'val': [...]} (delete the file to resample)"


def read_fewshot_cache(path: Path, folder_name: str) -> tuple[list[Item], list[Item] | None]:
    """(train, val) from a vacsr or CoOp-family cache; val is None when the file has none.

    Every way a damaged or crafted file can fail (a flipped byte makes pickle raise anything from
    TypeError to MemoryError) is one DataError. Opcodes are checked before the C unpickler sees
    them (`_decode`): a flipped byte in a memo index makes it allocate and clear gigabytes.
    """
    try:
        data = _decode(path.read_bytes())
    except RecursionError:
        raise DataError(f"{path}: unreadable few-shot cache (nested too deeply); "
                        f"{_RESAMPLE}") from None
    except Exception as exc:  # noqa: BLE001  pickle raises any type on damaged input
        reason = " ".join(str(exc).split())[:120] or exc.__class__.__name__
        raise DataError(f"{path}: unreadable few-shot cache ({reason}); {_RESAMPLE}") from None
    if not isinstance(data, dict) or "train" not in data:
        raise DataError(f"{path}: few-shot cache has no 'train' entry; {_RESAMPLE}")
    train = _to_items(data["train"], folder_name, path)
    val = _to_items(data["val"], folder_name, path) if "val" in data else None
    return train, val


def _check_subset(cached: Sequence[Item], full: Sequence[Item], path: Path, split: str) -> None:
    """A cache made from another split file would silently change the benchmark: refuse it.
    The class name counts too (it becomes the label's prompt), and so does an item drawn twice
    (`random.sample` never repeats one)."""
    if isinstance(full, GroupedItems):
        names = {label: group[0].classname for label, group in full.groups().items()}
        known = lambda item: (full.has(item.path, item.label)  # noqa: E731
                              and names[item.label] == item.classname)
    else:
        known = set(full).__contains__
    drawn: set[str] = set()
    for item in cached:
        if not known(item):
            raise DataError(f"{path}: cached item {item.path!r} (label {item.label}, class "
                            f"{item.classname!r}) is not in the {split} split; expected a cache "
                            "made from this split (delete it to resample)")
        if item.path in drawn:
            raise DataError(f"{path}: cached item {item.path!r} is in the {split} sample twice; "
                            "expected each image once (delete the file to resample)")
        drawn.add(item.path)


def write_fewshot_cache(paths: Path | Sequence[Path], train: Sequence[Item],
                        val: Sequence[Item]) -> Path | None:
    """Write to the first of `paths` that takes it (the dataset folder, then the cache folder);
    None, with a warning, when none does."""
    items = pickle.dumps({"train": [(i.path, i.label, i.classname) for i in train],
                          "val": [(i.path, i.label, i.classname) for i in val]},
                         protocol=pickle.HIGHEST_PROTOCOL)
    payload = {"format": CACHE_FORMAT, "sha256": hashlib.sha256(items).hexdigest(),
               "items": items}
    for path in [paths] if isinstance(paths, Path) else paths:
        try:
            atomic_pickle(path, payload)
            return path
        except (OSError, StorageError):  # atomic writes report EROFS / ENOSPC as StorageError
            continue
    # A read-only dataset folder must not stop training: the draw is deterministic anyway.
    warnings.warn(f"{path}: could not write the few-shot cache; continuing without it",
                  stacklevel=2)
    return None


def load_or_sample(dataset_dir: Path, train: Sequence[Item], val: Sequence[Item] | None, *,
                   shots: int, seed: int) -> tuple[list[Item], list[Item]]:
    """The cached few-shot (train, val) for (K, seed), drawn and saved on first use.

    `val=None` means the dataset has no val split (ImageNet): val then comes from the remaining
    train images (see `val_from_remaining_train`).
    """
    paths = (fewshot_path(dataset_dir, shots, seed),
             fallback_fewshot_path(dataset_dir, shots, seed))
    path = next((p for p in paths if p.is_file()), None)
    if path is not None:
        few_train, few_val = read_fewshot_cache(path, dataset_dir.name)
        _check_subset(few_train, train, path, "train")
        if few_val is None:  # CoOp's ImageNet caches hold train only
            few_val = (val_from_remaining_train(train, few_train, shots, seed) if val is None
                       else sample_train_val(train, val, shots, seed)[1])
        _check_subset(few_val, train if val is None else val, path, "val")
        return few_train, few_val
    if val is None:
        few_train = sample_few_shot(train, shots, random.Random(seed))
        few_val = val_from_remaining_train(train, few_train, shots, seed)
    else:
        few_train, few_val = sample_train_val(train, val, shots, seed)
    write_fewshot_cache(paths, few_train, few_val)
    return few_train, few_val


# ---------------------------------------------------------------- base / novel
def subsample_labels(labels: Iterable[int], subsample: str) -> list[int]:
    """The labels of the `subsample` ("all", "base" or "novel"), sorted: base the first ceil(n/2)
    of the sorted labels, novel the rest (CoOp)."""
    if subsample not in ("all", "base", "novel"):
        raise ValueError(f"subsample must be all, base or novel, got {subsample!r}")
    labels = sorted(labels)
    half = math.ceil(len(labels) / 2)
    return labels if subsample == "all" else labels[:half] if subsample == "base" else labels[half:]


def subsample_classes(*splits: Sequence[Item], subsample: str) -> tuple[list[Item], ...]:
    """CoOp's split: sort the labels of the first split, base = first ceil(n/2), novel = rest,
    each relabelled 0..k-1 in sorted order; every split is filtered with the same classes."""
    if subsample == "all":
        return tuple(list(split) for split in splits)
    selected = subsample_labels({item.label for item in splits[0]}, subsample)
    relabel = {old: new for new, old in enumerate(selected)}
    return tuple([Item(i.path, relabel[i.label], i.classname) for i in split if i.label in relabel]
                 for split in splits)
