"""The tiny CLIP pretrained once per machine: the demo, the embedded sweeps and the tests all
start from the same seeded recipe (vacsr/model/pretrain.py), so its weights are kept in the user
cache under a digest of that recipe and copied from there.

The digest covers everything the weights depend on: the recipe's arguments, the model's open_clip
config, the pretraining code (a changed pretrain.py is a new recipe), the torch build and the
open_clip version (their kernels and initialisers decide the numbers); all read from the
installed files, so a cache hit imports neither torch nor open_clip. The file is written
atomically with its SHA-256 beside it and checked against it on every use; a damaged one is
pretrained again.
One process pretrains while the others wait on a lock, so parallel demos or test workers train once.

Cache folder: `$VACSR_CACHE_DIR/pretrained`, else `~/.cache/vacsr/pretrained` (as the listing and
few-shot caches).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from contextlib import contextmanager
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Iterator

from vacsr.atomic import atomic_write, atomic_write_json
from vacsr.model.configs import MODEL_CONFIG_DIR

# pretrain_clip's keyword arguments for the tiny model the demo, the sweeps and the tests use
TINY_RECIPE: dict[str, Any] = {"name": "vacsr-tiny", "num_images": 1024, "epochs": 6,
                               "batch_size": 128, "lr": 2e-3, "seed": 0, "image_size": 32}


def cache_dir() -> Path:
    base = os.environ.get("VACSR_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "vacsr") / "pretrained"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        for block in iter(lambda: src.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def recipe_digest(recipe: dict[str, Any]) -> str:
    """What the pretrained weights depend on, hashed (see the module docstring). Versions and
    source are read without importing torch or open_clip: a cache hit costs no start-up."""
    model_config = MODEL_CONFIG_DIR / f"{recipe['name']}.json"
    torch_build = Path(find_spec("torch").submodule_search_locations[0]) / "version.py"
    parts = {"recipe": recipe, "torch": version("torch"), "open_clip": version("open_clip_torch"),
             "torch_build": sha256_of(torch_build),  # its version with the build tag (+cu130)
             "code": sha256_of(Path(find_spec("vacsr.model.pretrain").origin)),
             "model_config": sha256_of(model_config) if model_config.is_file() else None}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Held by one process at a time (the others block): one of them pretrains."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _verified(path: Path, sums: Path) -> str | None:
    """The file's SHA-256 when it matches the one recorded beside it, else None."""
    try:
        recorded = json.loads(sums.read_text())["sha256"]
        return recorded if path.is_file() and sha256_of(path) == recorded else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cached_weights(recipe: dict[str, Any] | None = None, *, progress: bool = False
                   ) -> tuple[Path, str]:
    """(path, SHA-256) of the weights `recipe` pretrains, pretraining them only when the cache
    lacks them or holds a damaged copy."""
    recipe = dict(TINY_RECIPE if recipe is None else recipe)
    digest = recipe_digest(recipe)
    folder = cache_dir()
    path = folder / f"{recipe['name']}-{digest[:16]}.pt"
    sums = path.with_name(path.name + ".json")
    with _exclusive(folder / f"{path.name}.lock"):
        found = _verified(path, sums)
        if found is not None:
            return path, found
        if path.exists():
            print(f"{path}: does not match its recorded SHA-256; pretraining it again",
                  file=sys.stderr, flush=True)
        print(f"pretraining the tiny CLIP on synthetic pairs (once per machine) -> {path}",
              file=sys.stderr, flush=True)
        from vacsr.model.pretrain import pretrain_clip  # torch, open_clip: only to pretrain

        pretrain_clip(path, progress=progress, **recipe)
        found = sha256_of(path)
        atomic_write_json(sums, {"sha256": found, "recipe": recipe, "recipe_digest": digest})
    return path, found


def install_pretrained(dest: str | Path, recipe: dict[str, Any] | None = None, *,
                       progress: bool = False) -> Path:
    """Copy the cached weights to `dest` (atomically) and record beside it, in
    `<dest>.json`, where they came from and their SHA-256; pretrains first if the cache lacks
    them. A `dest` already holding those weights is left as it is."""
    dest = Path(dest)
    source, found = cached_weights(recipe, progress=progress)
    record = dest.with_name(dest.name + ".json")
    if _verified(dest, record) == found:
        return dest
    atomic_write(dest, lambda tmp: shutil.copyfile(source, tmp))
    atomic_write_json(record, {"sha256": found, "source": str(source),
                               "recipe": json.loads((source.with_name(source.name + ".json"))
                                                    .read_text())["recipe"]})
    return dest


def weights_record(pretrained: str | None) -> dict[str, Any]:
    """Which weights a sweep's runs start from, for its folder's record: a file's path and
    SHA-256 (with the recipe of an installed tiny CLIP), an open_clip tag as given, or none."""
    if not pretrained:
        return {"weights": None}
    path = Path(pretrained).expanduser()
    if not path.is_file():
        return {"open_clip_tag": pretrained}
    record: dict[str, Any] = {"path": str(path.resolve()), "sha256": sha256_of(path)}
    try:  # an installed tiny CLIP whose file is still what its record says: name its recipe
        installed = json.loads(path.with_name(path.name + ".json").read_text())
        if installed["sha256"] == record["sha256"]:
            record["recipe"] = installed.get("recipe")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return record
