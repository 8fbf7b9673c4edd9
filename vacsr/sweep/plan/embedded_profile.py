"""The embedded profile (embedded.yaml): what a sweep script runs without --data-root, the paper's
defaults where neither it nor a flag gives a value, and the synthetic data and pretrained tiny
CLIP it writes into the sweep folder."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from vacsr import config as cfg
from vacsr.data.synthetic_layout import IMAGENET_1K, SyntheticSizes
from vacsr.sweep.plan.folders import embedded_data, embedded_weights
from vacsr.sweep.spec.kind import SweepKind

PROFILE = Path(__file__).with_name("embedded.yaml")
# the paper's defaults where neither the profile nor a flag gives a value
DEFAULTS = {"trials": 24, "seeds": [1, 2, 3], "shots": 16, "cpus_per_worker": 1.0,
            "trial_cpus": 1.0, "model": "vacsr-tiny"}


def load_profile(kind: SweepKind, path: Path = PROFILE) -> dict[str, Any]:
    """The embedded profile with the kind's section merged in (`set` merges, `range` replaces)."""
    profile = cfg.read_yaml_file(path, "the embedded sweep profile")
    section = (profile.pop("kinds", None) or {}).get(kind.name, {})
    profile["set"] = {**profile.get("set", {}), **section.get("set", {})}
    profile["range"] = section.get("range", profile.get("range", {}))
    return profile


def pick(flag: Any, profile: dict, key: str) -> Any:
    return flag if flag is not None else profile.get(key, DEFAULTS[key])


def synthetic_sizes(profile: dict[str, Any]) -> SyntheticSizes:
    """What the profile's synthetic data holds (`synthetic_per_class`, `imagenet_classes`)."""
    return SyntheticSizes(per_class=tuple(profile["synthetic_per_class"]),
                          imagenet_classes=profile.get("imagenet_classes", IMAGENET_1K))


def synthetic_train_counts(kind: SweepKind, sizes: SyntheticSizes,
                           datasets: list[str]) -> dict[str, dict[int, int]]:
    """Training images per label of each dataset the units train on, as the profile's data will
    hold them (the counts a real --data-root's check returns, for the same checks)."""
    if kind.task == "retrieval":
        return {}
    from vacsr.data.synthetic_layout import split_sizes

    return {name: split_sizes(name, sizes.per_class, sizes.imagenet_classes)["train"]
            for name in datasets}


def write_embedded_data(kind: SweepKind, profile: dict, storage: Path, model: str,
                   pretrained: str | None, datasets: list[str]) -> tuple[Path, str | None]:
    """No --data-root: synthetic data in the real layouts (and the pretrained tiny CLIP)."""
    from vacsr.data.generate import generate_sizes

    root = embedded_data(storage)
    if not (root / ".generated").is_file():
        print(f"writing synthetic datasets in their real layouts under {root}", flush=True)
        names = [d for d in kind.data_needed(datasets) if d not in kind.also_accepts]
        generate_sizes(root, synthetic_sizes(profile), datasets=names)
        (root / ".generated").write_text("ok\n")
    weights = embedded_weights(storage)
    if pretrained is None and profile.get("pretrain_tiny") and model == profile["model"]:
        from vacsr.model.pretrained_cache import install_pretrained

        # from the machine's cache (pretrained there once, by a digest of its recipe), with
        # its source and SHA-256 recorded beside it
        install_pretrained(weights)
        pretrained = str(weights)
    return root, pretrained
