"""Noisy correspondence (NCR, Huang et al. 2021): per-caption image indices shuffled at a ratio.

NCR's recipe, reproduced exactly: with a seeded NumPy generator, shuffle the caption indices,
take the first int(r * N) of them, and permute their image indices among themselves. The result is
saved as a .npy file holding the noisy caption -> image index (the format NCR's `noise_file` uses),
and reused whenever that file exists, so every trial and every method sees the same noise.
Permuting within the subset keeps each image's caption count; a few selected captions may land on
their own image by chance, exactly as in NCR.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from vacsr.data.checked_io import atomic_write_bytes
from vacsr.errors import DataError


def make_noisy_index(caption_to_image: np.ndarray, ratio: float,
                     seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(noisy caption -> image index, sorted indices of the int(ratio * N) selected captions)."""
    clean = np.asarray(caption_to_image, dtype=np.int64)
    # RandomState(seed) gives the stream of NCR's np.random.seed(seed) + np.random.shuffle.
    rng = np.random.RandomState(seed)
    order = np.arange(len(clean))
    rng.shuffle(order)
    selected = order[: int(ratio * len(clean))]
    permuted = clean[selected].copy()
    rng.shuffle(permuted)
    noisy = clean.copy()
    noisy[selected] = permuted
    return noisy, np.sort(selected)


def default_noise_path(folder: Path, name: str, ratio: float, seed: int) -> Path:
    return folder / "noise_index" / f"{name}_noise{ratio:g}_seed{seed}.npy"


def _validate(noisy: np.ndarray, clean: np.ndarray, path: Path) -> np.ndarray:
    expected = f"a 1-D integer array of {len(clean)} image indices permuting this train split's"
    if noisy.ndim != 1 or len(noisy) != len(clean) or not np.issubdtype(noisy.dtype, np.integer):
        raise DataError(f"{path}: noise index has shape {noisy.shape} and dtype {noisy.dtype}; "
                        f"expected {expected}")
    size = int(clean.max()) + 1 if len(clean) else 0
    in_range = len(noisy) == 0 or (noisy.min() >= 0 and noisy.max() < size)
    # Shuffling among the selected captions keeps each image's caption count: a file made for
    # another split or ordering almost surely breaks that.
    if not in_range or not np.array_equal(np.bincount(noisy, minlength=size),
                                          np.bincount(clean, minlength=size)):
        raise DataError(f"{path}: noise index does not permute the clean caption-to-image index; "
                        f"expected {expected}")
    return noisy.astype(np.int64)


def load_noise(path: Path, clean: np.ndarray) -> np.ndarray:
    try:
        noisy = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable noise index ({exc.__class__.__name__}); expected a "
                        ".npy file") from None
    return _validate(np.asarray(noisy), np.asarray(clean, dtype=np.int64), path)


def save_noise(path: Path, noisy: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(noisy, dtype=np.int64))
    atomic_write_bytes(path, buffer.getvalue())


def noisy_caption_to_image(caption_to_image, ratio: float, seed: int, path: Path) -> np.ndarray:
    """The saved noise index at `path` if it exists, else a new one, saved there."""
    clean = np.asarray(caption_to_image, dtype=np.int64)
    if path.is_file():
        return load_noise(path, clean)
    noisy, _ = make_noisy_index(clean, ratio, seed)
    save_noise(path, noisy)
    return noisy
