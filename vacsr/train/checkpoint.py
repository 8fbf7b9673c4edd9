"""Checkpoints: written atomically, read back with weights_only=True, and checked against the
config about to load them, so that a checkpoint of another architecture fails with one line
naming the differing keys instead of a state-dict traceback."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vacsr.atomic import atomic_write
from vacsr.config import shown, to_dict
from vacsr.errors import CheckpointError
from vacsr.train.run_files import CHECKPOINT_FILE

# config keys that change the model's parameter names or shapes
ARCHITECTURE_KEYS = ("model.name", "model.use_gpo", "adapter.kind", "adapter.hidden_dim",
                     "adapter.latent_dim", "adapter.num_components", "adapter.decoder_hidden_dim",
                     "adapter.reduction", "adapter.context_tokens", "adapter.context_init",
                     "adapter.mma_blocks", "adapter.mma_dim", "adapter.maple_depth")
# config keys that change which parameters train, hence the optimizer's parameter groups
TRAINABLE_KEYS = ("model.trainable_image_blocks", "model.trainable_text_blocks",
                  "model.train_projections", "model.train_embeddings", "model.trainable_side")
_UNKNOWN = object()
# what each entry of the dict `vacsr train` writes holds (entries a file lacks are not checked
# here): a crafted or foreign payload fails in one line, not in load_state_dict's TypeError
PAYLOAD_TYPES = {
    "model": (dict, "a state dict (parameter names to tensors)"),
    "optimizer": (dict, "an optimizer state dict"),
    "epoch": (int, "an epoch number"),
    "history": (list, "a list of per-epoch metrics"),
    "config": ((dict, type(None)), "a config mapping"),
}


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write `state` to `path`; a crash or a full disk leaves the previous file intact."""
    return atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many types for truncated or foreign files
        raise CheckpointError(f"{path}: not a readable vacsr checkpoint "
                              f"({exc.__class__.__name__})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a vacsr checkpoint; "
                              f"expected the dict `vacsr train` writes ({CHECKPOINT_FILE})")
    check_payload(path, state)
    return state


def checkpoint_problem(path: str | Path) -> str | None:
    """Why `path` does not load as a checkpoint (load_checkpoint's CheckpointError text, which
    starts with the path), or None when it loads."""
    try:
        load_checkpoint(path)
    except CheckpointError as exc:
        return str(exc)
    return None


def _entry_problem(key: str, value: Any) -> str | None:
    """What is wrong with `state[key]`, said of the entry (None: it holds what PAYLOAD_TYPES
    says)."""
    kinds, expected = PAYLOAD_TYPES[key]
    if not isinstance(value, kinds) or isinstance(value, bool):
        return f"holds a {type(value).__name__}, expected {expected}"
    if key == "model":
        for name, tensor in value.items():
            if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
                return (f"maps {str(name)[:60]!r} to a {type(tensor).__name__}, expected "
                        f"{expected}")
    if key == "history":
        other = next((epoch for epoch in value if not isinstance(epoch, dict)), _UNKNOWN)
        if other is not _UNKNOWN:
            return f"holds a {type(other).__name__} among its epochs, expected {expected}"
    return None


def check_payload(path: str | Path, state: dict) -> None:
    """CheckpointError (one line naming the file and the entry) for the first entry of `state`
    that does not hold what `vacsr train` writes there."""
    for key in PAYLOAD_TYPES:
        if key in state and (problem := _entry_problem(key, state[key])) is not None:
            raise CheckpointError(f"{path}: its {key!r} entry {problem}; not a checkpoint "
                                  "`vacsr train` writes")


def config_differences(stored: dict, current: dict, keys: tuple[str, ...]
                       ) -> list[tuple[str, Any, Any]]:
    """(key, stored value, current value) for each of `keys` the two nested configs disagree on;
    keys an older checkpoint does not record are skipped."""
    diffs = []
    for key in keys:
        section, name = key.split(".")
        old = stored.get(section, {}).get(name, _UNKNOWN)
        new = current[section][name]
        if old is not _UNKNOWN and old != new:
            diffs.append((key, old, new))
    return diffs


def check_same_architecture(path: str | Path, state: dict, config, *,
                            keys: tuple[str, ...] = ARCHITECTURE_KEYS,
                            hint: str = "pass the same value or a matching checkpoint") -> None:
    """Raise CheckpointError naming every key of `keys` on which the config stored in `state`
    and `config` differ (nothing to compare when the checkpoint stores no config)."""
    stored = state.get("config")
    if not isinstance(stored, dict):
        return
    diffs = config_differences(stored, to_dict(config), keys)
    if not diffs:
        return
    if len(diffs) == 1:
        key, old, new = diffs[0]
        raise CheckpointError(f"{path}: built with {key}={shown(old)}, this config has "
                              f"{shown(new)}; {hint}")
    built = ", ".join(f"{k}={shown(old)}" for k, old, _ in diffs)
    has = ", ".join(f"{k}={shown(new)}" for k, _, new in diffs)
    raise CheckpointError(f"{path}: built with {built}; this config has {has}; "
                          f"{hint.replace('the same value', 'the same values')}")


def _first_problem(exc: RuntimeError) -> str:
    """The first entry of load_state_dict's multi-line report, shortened to fit one line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    problem = lines[1] if len(lines) > 1 else (lines[0] if lines else type(exc).__name__)
    return problem if len(problem) <= 160 else problem[:157] + "..."


def load_model_state(model: nn.Module, state: dict, path: str | Path, config, *,
                     keys: tuple[str, ...] = ARCHITECTURE_KEYS,
                     hint: str = "pass the same value or a matching checkpoint") -> None:
    """Load `state["model"]` into `model` after checking the stored config's `keys`; a checkpoint
    without a stored config that still does not fit fails with load_state_dict's first problem."""
    check_same_architecture(path, state, config, keys=keys, hint=hint)
    if "model" not in state:
        raise CheckpointError(f"{path}: holds no model weights (not a vacsr training checkpoint)")
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: does not fit the model of this config "
                              f"({_first_problem(exc)}); pass the config it was trained with "
                              "or a matching checkpoint") from None
