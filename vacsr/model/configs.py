"""vacsr's own open_clip model configs (the tiny test model), readable without open_clip: a
sweep driver needs only their tower depths, and importing open_clip costs it seconds."""
from __future__ import annotations

import json
from pathlib import Path

MODEL_CONFIG_DIR = Path(__file__).with_name("model_configs")


def own_model_config(name: str) -> dict | None:
    """The config vacsr ships for `name` (open_clip's JSON format), or None."""
    path = MODEL_CONFIG_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None
