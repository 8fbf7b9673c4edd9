"""Typed configuration: dataclasses hold every default, YAML and `key.sub=value` only override.

Defaults follow the paper (sec. 3, appendix C.2, E.1-E.3). Unknown keys and invalid values raise
one ConfigError naming the key before anything runs. The config imports no torch, Ray, MLflow or
Optuna.

- `schema`: the dataclasses and their defaults, the choices some keys take, the data bounds.
- `overrides`: `key.sub=value` texts and mappings applied to a Config, values converted to type.
- `yaml_reader`: the bounded YAML reader of config text and config files.
- `serialise`: a Config as a nested or flat dict, and saved as YAML.
- `validation`: the range and choice checks.
- `load`: `load_config` and `from_dict`, which build a Config and validate it.
"""
from __future__ import annotations

from vacsr.config.load import from_dict, load_config
from vacsr.config.overrides import MAX_SHOWN_CHARS, apply_mapping, parse_override, set_value, shown
from vacsr.config.schema import (
    ADAPTER_INITS,
    BACKBONE_GRADS,
    DEFAULT_METHOD,
    LOSS_NEG_COLUMNS,
    LOSS_REDUCTIONS,
    MAX_CAPTIONS_PER_IMAGE,
    MAX_IMAGE_SIZE,
    MAX_SEED,
    MAX_SPLIT_PIXEL_BYTES,
    SECTIONS,
    TRAINABLE_SIDES,
    AdapterConfig,
    Config,
    DataConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    TrackingConfig,
    TrainConfig,
)
from vacsr.config.serialise import flat_dict, flatten, public_dict, save_config, to_dict
from vacsr.config.validation import max_synthetic_images, validate
from vacsr.config.yaml_reader import (
    MAX_CONFIG_BYTES,
    MAX_YAML_DEPTH,
    YamlRefused,
    load_yaml_text,
    read_config_text,
    read_yaml_file,
)

__all__ = [
    "ADAPTER_INITS", "BACKBONE_GRADS", "DEFAULT_METHOD", "LOSS_NEG_COLUMNS", "LOSS_REDUCTIONS",
    "MAX_CAPTIONS_PER_IMAGE", "MAX_CONFIG_BYTES", "MAX_IMAGE_SIZE", "MAX_SEED", "MAX_SHOWN_CHARS",
    "MAX_SPLIT_PIXEL_BYTES", "MAX_YAML_DEPTH", "SECTIONS", "TRAINABLE_SIDES", "AdapterConfig",
    "Config", "DataConfig", "LossConfig", "ModelConfig", "OptimConfig", "TrackingConfig",
    "TrainConfig", "YamlRefused", "apply_mapping", "flat_dict", "flatten", "from_dict",
    "load_config", "load_yaml_text", "max_synthetic_images", "parse_override", "public_dict",
    "read_config_text", "read_yaml_file", "save_config", "set_value", "shown", "to_dict",
    "validate",
]
