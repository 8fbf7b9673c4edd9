"""Validation of a Config: the first value out of its range or choices raises one ConfigError
line naming its key."""
from __future__ import annotations

import math
import typing
from typing import Any

from vacsr.compute_device import parse_device
from vacsr.config import schema
from vacsr.config.overrides import quoted, section_types
from vacsr.config.schema import Config, DataConfig, OptimConfig
from vacsr.config.serialise import to_dict
from vacsr.errors import ConfigError
from vacsr.task_names import TASK_NAMES


def _check(condition: bool, key: str, expected: str, value: Any) -> None:
    if not condition:
        raise ConfigError(f"{key}: expected {expected}, got {quoted(value)}")


def _one_of(key: str, value: Any, choices: tuple[str, ...]) -> None:
    _check(value in choices, key, "one of " + ", ".join(choices), value)


def validate(config: Config) -> Config:
    """Raise ConfigError for the first invalid value; return the config unchanged otherwise."""
    m, a, loss, o, d, t = (config.model, config.adapter, config.loss, config.optim,
                           config.data, config.train)
    _validate_strings(config)
    _check(bool(m.name), "model.name", "a model name", m.name)
    _check(m.trainable_image_blocks >= -1, "model.trainable_image_blocks", "-1 (all) or >= 0",
           m.trainable_image_blocks)
    _check(m.trainable_text_blocks >= -1, "model.trainable_text_blocks", "-1 (all) or >= 0",
           m.trainable_text_blocks)
    _one_of("model.trainable_side", m.trainable_side, schema.TRAINABLE_SIDES)
    # adapter.kind names a method: vacsr/methods/registry.py checks it where a model is built
    _check(bool(a.kind), "adapter.kind", "a method name", a.kind)
    _check(a.reduction >= 1, "adapter.reduction", ">= 1", a.reduction)
    _check(math.isfinite(a.residual_ratio) and 0 <= a.residual_ratio <= 1,
           "adapter.residual_ratio", "a ratio in [0, 1]", a.residual_ratio)
    _check(a.context_tokens >= 1, "adapter.context_tokens", ">= 1", a.context_tokens)
    _check(bool(a.context_init.strip()), "adapter.context_init", "random or a phrase",
           a.context_init)
    _check(a.mma_blocks >= 1 or a.mma_blocks == -1, "adapter.mma_blocks",
           "-1 (the paper's share) or >= 1", a.mma_blocks)
    _check(a.mma_dim >= 1, "adapter.mma_dim", ">= 1", a.mma_dim)
    _check(math.isfinite(a.mma_scale) and a.mma_scale >= 0, "adapter.mma_scale", ">= 0",
           a.mma_scale)
    _check(a.maple_depth >= 1 or a.maple_depth == -1, "adapter.maple_depth",
           "-1 (the paper's share) or >= 1", a.maple_depth)
    _check(a.hidden_dim >= 1, "adapter.hidden_dim", ">= 1", a.hidden_dim)
    _check(a.latent_dim >= 1, "adapter.latent_dim", ">= 1", a.latent_dim)
    _check(a.num_components >= 1, "adapter.num_components", "K >= 1", a.num_components)
    _check(a.decoder_hidden_dim >= 0, "adapter.decoder_hidden_dim", ">= 0", a.decoder_hidden_dim)
    _one_of("adapter.init", a.init, schema.ADAPTER_INITS)
    if a.init == "cosine":  # two first-layer units and two decoder units carry +-cos
        _check(a.hidden_dim >= 2, "adapter.hidden_dim", ">= 2 with adapter.init=cosine",
               a.hidden_dim)
        _check(a.decoder_hidden_dim != 1, "adapter.decoder_hidden_dim",
               "0 or >= 2 with adapter.init=cosine", a.decoder_hidden_dim)
    for name in ("alpha_kl", "beta", "gamma"):
        value = getattr(loss, name)
        _check(math.isfinite(value) and value >= 0, f"loss.{name}", "a finite weight >= 0", value)
    _check(math.isfinite(a.logvar_bound) and a.logvar_bound > 0, "adapter.logvar_bound",
           "a finite bound > 0", a.logvar_bound)
    _check(math.isfinite(a.init_logit_bias), "adapter.init_logit_bias", "a finite number",
           a.init_logit_bias)
    _check(loss.num_hard_negatives >= 1, "loss.num_hard_negatives", "N_h >= 1",
           loss.num_hard_negatives)
    _one_of("loss.neg_sigma_target", loss.neg_sigma_target, ("label", "positive"))
    _one_of("loss.reduction", loss.reduction, schema.LOSS_REDUCTIONS)
    _one_of("loss.neg_columns", loss.neg_columns, schema.LOSS_NEG_COLUMNS)
    _one_of("loss.backbone_grad", loss.backbone_grad, schema.BACKBONE_GRADS)
    _validate_optim(o)
    _one_of("data.task", d.task, TASK_NAMES)
    _validate_synthetic_sizes(d)
    _check(d.num_workers >= 0, "data.num_workers", ">= 0", d.num_workers)
    _check(d.shots >= 1, "data.shots", ">= 1", d.shots)
    _check(math.isfinite(d.prefix_cache_gib) and d.prefix_cache_gib >= 0,
           "data.prefix_cache_gib", "a finite size in GiB >= 0", d.prefix_cache_gib)
    _one_of("data.subsample_classes", d.subsample_classes, ("all", "base", "novel"))
    _check(0 <= d.noise_ratio < 1, "data.noise_ratio", "in [0, 1)", d.noise_ratio)
    _check(t.epochs >= 1, "train.epochs", ">= 1", t.epochs)
    _check(0 <= t.seed <= schema.MAX_SEED, "train.seed", f"0 to {schema.MAX_SEED}", t.seed)
    _check(t.batch_size >= 2, "train.batch_size", ">= 2", t.batch_size)
    _check(t.eval_every >= 1, "train.eval_every", ">= 1", t.eval_every)
    _check(t.workers >= 1, "train.workers", ">= 1", t.workers)
    _check(t.batch_size % t.workers == 0, "train.batch_size",
           f"a multiple of train.workers ({t.workers})", t.batch_size)
    _check(t.gpus_per_worker >= 0, "train.gpus_per_worker", ">= 0", t.gpus_per_worker)
    _check(t.cpus_per_worker > 0, "train.cpus_per_worker", "> 0", t.cpus_per_worker)
    _check(t.max_failures >= 0, "train.max_failures", ">= 0", t.max_failures)
    parse_device(t.device)  # the text only: whether this machine has it is checked where it runs
    return config


def max_synthetic_images(image_size: int) -> int:
    """The most synthetic images of `image_size` pixels a split holds (MAX_SPLIT_PIXEL_BYTES)."""
    return schema.MAX_SPLIT_PIXEL_BYTES // (3 * image_size * image_size)


def _validate_synthetic_sizes(d: DataConfig) -> None:
    _check(8 <= d.image_size <= schema.MAX_IMAGE_SIZE, "data.image_size",
           f"8 to {schema.MAX_IMAGE_SIZE} pixels", d.image_size)
    most = max_synthetic_images(d.image_size)
    for key, count in (("data.num_train", d.num_train), ("data.num_test", d.num_test)):
        _check(1 <= count <= most, key,
               f"1 to {most:,} images of {d.image_size}x{d.image_size} pixels (a synthetic split "
               f"is held in memory: at most {schema.MAX_SPLIT_PIXEL_BYTES >> 30} GiB of pixels)",
               count)
    _check(1 <= d.captions_per_image <= schema.MAX_CAPTIONS_PER_IMAGE, "data.captions_per_image",
           f"1 to {schema.MAX_CAPTIONS_PER_IMAGE}", d.captions_per_image)


def _validate_optim(o: OptimConfig) -> None:
    _check(math.isfinite(o.lr) and o.lr > 0, "optim.lr", "a finite rate > 0", o.lr)
    _check(math.isfinite(o.weight_decay) and o.weight_decay >= 0, "optim.weight_decay",
           "a finite number >= 0", o.weight_decay)
    _check(math.isfinite(o.backbone_lr_mult) and o.backbone_lr_mult >= 0,
           "optim.backbone_lr_mult", "a finite number >= 0", o.backbone_lr_mult)
    _one_of("optim.schedule", o.schedule, ("step", "cosine", "constant"))
    if o.schedule == "step":
        _check(len(o.decay_epochs) > 0, "optim.decay_epochs", "a non-empty list of epochs",
               o.decay_epochs)
        _check(all(e >= 1 for e in o.decay_epochs), "optim.decay_epochs", "epochs >= 1",
               o.decay_epochs)
    _check(0 < o.decay_factor <= 1, "optim.decay_factor", "in (0, 1]", o.decay_factor)
    _check(o.warmup_epochs >= 0, "optim.warmup_epochs", ">= 0", o.warmup_epochs)
    _check(math.isfinite(o.grad_clip) and o.grad_clip >= 0, "optim.grad_clip",
           "a finite norm >= 0 (0 disables)", o.grad_clip)


def _validate_strings(config: Config) -> None:
    """An empty string never stands for a default: optional keys take null, the others a value
    (an empty output_dir or root would otherwise quietly mean the current folder)."""
    for section, values in to_dict(config).items():
        types = section_types(section)
        for name, value in values.items():
            if isinstance(value, str) and not value.strip():
                optional = type(None) in typing.get_args(types[name])
                _check(False, f"{section}.{name}",
                       "a non-empty value" + (" or null for the default" if optional else ""),
                       value)
