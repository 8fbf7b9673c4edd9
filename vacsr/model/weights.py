"""Local weights files (`model.pretrained=<file>`): the one place vacsr loads them.

torch.load runs with weights_only=True (a pickle that would build anything but tensors is refused),
and every way a file can fail to be weights for the model (random bytes, a YAML file, a pickle
with code, a truncated archive, another architecture's state dict) is one ConfigError line naming
the file, instead of torch's multi-line report.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from vacsr.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

EXPECTED = ("a state dict saved with torch.save (e.g. by `vacsr pretrain-tiny`) or an open_clip "
            "checkpoint of this model")


def _reason(exc: BaseException) -> str:
    """What went wrong, in a few words: torch's reports run over many lines."""
    text = " ".join(str(exc).split())
    if "Unsupported global" in text:
        return ("a pickle of objects other than tensors (it could run code), refused by "
                "torch.load(weights_only=True)")
    if "Weights only load failed" in text:
        return "not tensors saved with torch.save, refused by torch.load(weights_only=True)"
    if isinstance(exc, RuntimeError) and "loading state_dict" in text:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        problem = lines[1] if len(lines) > 1 else text
        return "does not fit the model: " + (problem if len(problem) <= 160
                                               else problem[:157] + "...")
    return f"not a file torch.save writes ({exc.__class__.__name__})"


@contextlib.contextmanager
def random_init_expected():
    """open_clip warns (root logger) that a model built without `pretrained` is randomly
    initialised: where the weights are loaded right after (a weights file, a checkpoint) or
    trained from scratch, that notice is false, so it is dropped."""
    notice = logging.Filter()
    notice.filter = lambda record: "No pretrained weights loaded" not in record.getMessage()
    root = logging.getLogger()
    root.addFilter(notice)
    try:
        yield
    finally:
        root.removeFilter(notice)


# what the files torch.save writes start with: a zip archive (torch >= 1.6, TorchScript archives
# such as OpenAI's .pt too) or a pickle (protocol 2+), and what a .safetensors file starts with
# (an 8-byte little-endian header length, then its JSON header)
ZIP_MAGIC, PICKLE_MAGIC = b"PK\x03\x04", b"\x80"


def check_weights_file(path: str | Path) -> None:
    """A cheap look at a weights file before anything is built (a sweep driver checks
    --pretrained before Ray starts): readable, and the kind of file a loader of weights reads.
    Whether it fits the model is `load_weights`'s check."""
    try:
        with open(path, "rb") as src:
            head = src.read(16)
    except OSError as exc:
        raise ConfigError(f"model.pretrained: {path}: cannot read ({exc.strerror}); expected "
                          f"{EXPECTED}") from None
    safetensors = len(head) >= 9 and head[8:9] == b"{"
    if not (head.startswith(ZIP_MAGIC) or head.startswith(PICKLE_MAGIC) or safetensors):
        raise ConfigError(f"model.pretrained: {path} is not weights (starts with {head[:8]!r}, "
                          f"not a torch.save archive or pickle); expected {EXPECTED}")


def load_weights(model: nn.Module, path: str | Path, model_name: str) -> None:
    """Load the weights file `path` into `model` (open_clip's loader: it converts third-party
    and older open_clip state dicts), or raise one ConfigError line."""
    import open_clip

    try:
        with warnings.catch_warnings():  # torch notes the pickle protocol of every old file
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            open_clip.load_checkpoint(model, str(path), strict=True, weights_only=True)
    except Exception as exc:  # noqa: BLE001  torch and open_clip raise many types here
        raise ConfigError(f"model.pretrained: {path} is not {model_name} weights "
                          f"({_reason(exc)}); expected {EXPECTED}") from None


def create_with_weights(model_name: str, path: str | Path):
    """(model, train transform, eval transform) of open_clip's `model_name` with the weights
    file `path` loaded."""
    import open_clip

    with random_init_expected():
        model, train_transform, eval_transform = open_clip.create_model_and_transforms(
            model_name, pretrained=None)
    load_weights(model, path, model_name)
    return model, train_transform, eval_transform
