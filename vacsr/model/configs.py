"""open_clip model configs read as files, without importing open_clip: a sweep driver needs only
their tower shapes (depths for the space, widths and token counts for the memory estimate), and
importing open_clip costs it seconds (it imports torch and torchvision)."""
from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path

MODEL_CONFIG_DIR = Path(__file__).with_name("model_configs")
# what open_clip's registry keeps of a config file (open_clip.factory._rescan_model_configs)
CONFIG_KEYS = ("embed_dim", "vision_cfg", "text_cfg")


def own_model_config(name: str) -> dict | None:
    """The config vacsr ships for `name` (open_clip's JSON format), or None."""
    path = MODEL_CONFIG_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def packaged_model_config(name: str) -> dict | None:
    """open_clip's own config of `name` from the files its registry reads
    (open_clip/model_configs/<name>.json), or None: not a plain name (hf-hub:, local-dir:, a
    path), no such file, or open_clip not installed."""
    if not name or Path(name).name != name or ":" in name:
        return None
    spec = find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "model_configs" / f"{name}.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    return config if all(key in config for key in CONFIG_KEYS) else None


def model_config(name: str) -> dict | None:
    """The config open_clip's get_model_config returns for a plain model name once vacsr's own
    are registered (vacsr's first: they are added last, and a later file wins), or None where only
    open_clip can resolve it (hf-hub:, local-dir:)."""
    return own_model_config(name) or packaged_model_config(name)
