"""Typed configuration: dataclasses hold every default, YAML and `key.sub=value` only override.

Defaults follow the paper (sec. 3, appendix C.2, E.1-E.3). Unknown keys and
invalid values raise one ConfigError naming the key before anything runs.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vacsr.atomic import atomic_write_text
from vacsr.compute_device import parse_device
from vacsr.errors import ConfigError
from vacsr.redact import redact_uri
from vacsr.task_names import TASK_NAMES


@dataclass
class ModelConfig:
    """Backbone: an open_clip model and which of its parts train."""

    name: str = "vacsr-tiny"  # any open_clip model name (registered configs included)
    pretrained: str | None = None  # open_clip tag or a local weights file; None = random init
    use_gpo: bool = True  # retrieval: token outputs + GPO; False = pooled CLIP features
    trainable_image_blocks: int = -1  # N blocks of the image tower train; -1 = all
    trainable_text_blocks: int = -1  # N blocks of the text tower train; -1 = all
    # which end of each tower the N trainable blocks sit at: "first" (nearest the input, the
    # literal text of C.2's domain generalisation) or "last" (the blocks below stay frozen, the
    # common reading of "the number of frozen layers"; their output is then a constant of the
    # input, computed without autograd and cached for evaluation: vacsr/model/prefix.py)
    trainable_side: str = "first"
    train_projections: bool = True  # final LayerNorms and projections of both towers
    train_embeddings: bool = False  # patch/token/positional embeddings (full fine-tune only)


# Bounds of the synthetic data (DataConfig): a mistyped count is one line at validation, not a
# MemoryError while the split is rendered.
MAX_IMAGE_SIZE = 1024
MAX_SPLIT_PIXEL_BYTES = 2 << 30  # 2 GiB of RGB pixels in one split
MAX_CAPTIONS_PER_IMAGE = 100
# the seeds every seeded library takes (numpy's legacy seeding stops at 2**32 - 1): one larger
# fails inside each trial instead of in one line before the first
MAX_SEED = 2**32 - 1

ADAPTER_KINDS = ("vacsr", "sigmoid_baseline")
ADAPTER_INITS = ("random", "cosine")
TRAINABLE_SIDES = ("first", "last")
BACKBONE_GRADS = ("all", "recon")


@dataclass
class AdapterConfig:
    """The variational similarity adapter (paper section 3.1) or the sigmoid baseline."""

    kind: str = "vacsr"  # "vacsr" | "sigmoid_baseline" ("w/o all components" of Table 6)
    hidden_dim: int = 512  # encoder hidden width H
    latent_dim: int = 32  # latent dimension L per component
    num_components: int = 2  # K, Gaussian mixture components (K = 1 is "w/o GMM")
    decoder_hidden_dim: int = 64  # 0 = linear decoder L -> 1
    bounded_sigma: bool = True  # sigma_hat = sigmoid(.) (True) or exp(.) ("w/o sigmoid")
    # logvar in [-b, b] (smooth): L_sigma is unbounded below as sigma_hat -> 0 (sec. 3.2), so an
    # unbounded logvar lets training lower the loss without learning to rank
    logvar_bound: float = 8.0
    # the decoder's output bias at init: a pair starts at p = sigmoid(-4) ~ 0.018, about one
    # positive among the ~64 pairs of a row (the prior init of RetinaNet; SigLIP starts at -10).
    # At 0 every pair starts at p = 0.5 and the negatives' L_recon swamps the few positives: the
    # per-query reduction then left few-shot classification at chance (H ~3 after 8 epochs).
    init_logit_bias: float = -4.0
    # "cosine" | "random": cosine starts the logit at z = mu at the baseline head's 10 cos - 10
    # (then init_logit_bias is unused), random at chance; the paper does not state the init
    # (sec. 3.1, app. C.2). README, "The loss as implemented", measures both.
    init: str = "cosine"


@dataclass
class LossConfig:
    """Weights and switches of L = alpha L_KL + beta (L_recon + gamma (L_sigma^P + L_sigma^N))."""

    alpha_kl: float = 0.0005
    beta: float = 1.0
    gamma: float = 1.0
    num_hard_negatives: int = 1  # N_h per query, both directions
    straight_through: bool = True  # appendix B.1: dL/dm = -(y - p)
    neg_sigma_target: str = "label"  # "label" (y = 0) | "positive" (literal reading of E.1)
    use_kl: bool = True
    use_sigma_loss: bool = True
    # how L_recon and L_sigma are averaged (the paper does not say): "per_query" sums every term
    # over its pairs and divides by the B queries, so gamma = 1 weighs a pair's L_sigma like its
    # L_recon; "pair_mean" (means over each term's own pairs) collapsed at gamma = 1 under noisy
    # correspondence. Measured in benchmarks/bench_loss_paths.py; see losses._reduce.
    reduction: str = "per_query"
    neg_columns: str = "all"  # L_sigma^N column terms: "all" columns | "with_positive" only
    # the terms whose gradient reaches the backbone: "all" (the paper's one objective, sec. 3.2)
    # | "recon" (only beta L_recon; the adapter learns from the whole loss either way), an
    # ablation: model/backbone_grad.py, measured in docs/method.md ("Trainable blocks")
    backbone_grad: str = "all"


@dataclass
class OptimConfig:
    """AdamP with parameter groups and a per-epoch schedule."""

    lr: float = 5e-4
    weight_decay: float = 1e-4
    backbone_lr_mult: float = 0.1  # backbone groups train at lr * this
    schedule: str = "step"  # "step" | "cosine" | "constant"
    decay_epochs: list[int] = field(default_factory=lambda: [15])
    decay_factor: float = 0.1
    warmup_epochs: int = 0
    grad_clip: float = 2.0  # 0 disables clipping


@dataclass
class DataConfig:
    """Which dataset, where it lives, and how it is sampled."""

    task: str = "retrieval"  # "retrieval" | "classification"
    dataset: str = "synthetic"
    root: str | None = None  # dataset root folder; None = generated synthetic data
    image_size: int = 32  # only for synthetic data; real data uses the model's preprocessing
    # synthetic splits are rendered into memory before training, so their sizes are bounded
    # (validate): image_size <= MAX_IMAGE_SIZE, num_train and num_test images of at most
    # MAX_SPLIT_PIXEL_BYTES of RGB pixels a split (32 px: 699,050 images), captions_per_image
    # <= MAX_CAPTIONS_PER_IMAGE
    num_train: int = 512  # synthetic: train images
    num_test: int = 100  # synthetic: test images
    captions_per_image: int = 5
    num_workers: int = 0
    shots: int = 16  # few-shot classification: K shots per class
    subsample_classes: str = "base"  # "all" | "base" | "novel"
    noise_ratio: float = 0.0  # noisy correspondence ratio for retrieval training
    noise_file: str | None = None  # saved noise index (written on first use, then reused)
    # derived data kept beside the data: the noisy-correspondence index (vacsr/data/coco.py);
    # None = the dataset's own folder
    cache_dir: str | None = None
    # the frozen prefix's outputs of evaluation passes (vacsr/data/prefix_cache.py), shared by
    # the runs that read one split with one frozen prefix; None = no cache (sweeps set it)
    prefix_cache_dir: str | None = None
    prefix_cache_gib: float = 4.0  # per cached split; a larger split is evaluated uncached
    augment: bool = True  # open_clip's training augmentation; False = evaluation preprocessing


@dataclass
class TrainConfig:
    """The training run itself."""

    epochs: int = 25
    batch_size: int = 128
    seed: int = 1
    # "auto" | "cpu" | "cuda" | "cuda:N" (vacsr/compute_device.py); under Ray "cpu" keeps the tensors on
    # the CPU even where GPUs are reserved, and "auto" trains on the GPU Ray assigns
    device: str = "auto"
    amp: bool = True  # bf16 autocast (paper C.2) on CUDA; on a CPU only with amp_on_cpu
    # bf16 autocast on a CPU as well: the GPU's precision path where no GPU is (tests); off by
    # default, slower than fp32 on the CPUs measured (README "Mixed precision")
    amp_on_cpu: bool = False
    output_dir: str = "runs/vacsr"
    resume: bool = True  # continue from output_dir/last.ckpt when it exists
    eval_every: int = 1  # epochs between evaluations (last epoch always evaluated)
    eval_test: bool = True  # evaluate the test split after the last epoch (sweep trials: False)
    progress: bool = True
    ray: bool = False  # run through Ray Train (TorchTrainer) instead of in this process
    workers: int = 1  # Ray Train workers; the global batch is split evenly between them
    gpus_per_worker: float = 0.0  # 0 = CPU workers with gloo; > 0 = GPU workers with NCCL
    cpus_per_worker: float = 1.0
    max_failures: int = 2  # worker failures Ray Train recovers from (restarts from checkpoint)
    storage_path: str | None = None  # Ray Train storage (folder, s3://, gs://); None = output_dir


@dataclass
class TrackingConfig:
    """MLflow tracking (vacsr/records/); rank 0 logs."""

    enabled: bool = False
    uri: str | None = None  # None = $MLFLOW_TRACKING_URI, else sqlite:///<abs>/mlflow.db
    experiment: str = "vacsr-train"
    run_name: str | None = None
    parent_run_id: str | None = None


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


# ---------------------------------------------------------------- building and overriding
def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Convert a YAML value to the annotated type, or raise ConfigError naming `key`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {_quoted(value)}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {_quoted(value)}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {_quoted(value)}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {_quoted(value)}")
    if annotation is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {_quoted(value)}")
    raise ConfigError(f"{key}: unsupported type {annotation!r}")


def _section_types(section: str) -> dict[str, Any]:
    cls = typing.get_type_hints(Config)[section]
    return typing.get_type_hints(cls)


def set_value(config: Config, dotted_key: str, value: Any) -> None:
    """Set `section.field` on `config`, converting and checking the value's type."""
    parts = dotted_key.split(".")
    if len(parts) != 2:
        raise ConfigError(f"{dotted_key}: expected a key of the form section.field "
                          f"(sections: {', '.join(SECTIONS)})")
    section, name = parts
    if section not in SECTIONS:
        raise ConfigError(f"{dotted_key}: unknown section {section!r} (known: {', '.join(SECTIONS)})")
    types = _section_types(section)
    if name not in types:
        raise ConfigError(f"{dotted_key}: unknown key {name!r} in section {section!r} "
                          f"(known: {', '.join(types)})")
    setattr(getattr(config, section), name, _coerce(value, types[name], dotted_key))


def apply_mapping(config: Config, mapping: dict[str, Any], source: str = "config") -> Config:
    """Apply a nested {section: {field: value}} mapping (as read from YAML)."""
    if not isinstance(mapping, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(mapping).__name__}")
    for section, values in mapping.items():
        if section not in SECTIONS:
            raise ConfigError(f"{source}: unknown section {section!r} (known: {', '.join(SECTIONS)})")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping")
        for name, value in values.items():
            set_value(config, f"{section}.{name}", value)
    return config


# Config text is parsed by a bounded YAML loader: no aliases, at most this deep, at most this long
MAX_YAML_DEPTH = 16  # a config file nests section -> key -> list
MAX_CONFIG_BYTES = 1 << 20
MAX_SHOWN_CHARS = 120  # of a value quoted in an error line


def _quoted(value: Any) -> str:
    """repr(value), cut to fit an error line: a bad value as it was given."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 3] + "..."


def shown(value: Any, *, joined: bool = False) -> str:
    """A good value as the user writes it: after `key=` in an override (true, false, null,
    else str()), or with `joined` after a flag that takes a comma-separated list
    (--seeds 1,2,3)."""
    if joined and isinstance(value, list):
        return ",".join(shown(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


class YamlRefused(yaml.YAMLError):
    """Config text that the bounded loader does not read (an alias, too deep a nesting)."""

    def __init__(self, what: str, mark, advice: str) -> None:
        super().__init__(f"{what} (line {mark.line + 1}, column {mark.column + 1}): {advice}")


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader without aliases and with bounded nesting. An alias (`*name`) repeats a value
    without copying it: a few hundred bytes of nested aliases ("billion laughs") become billions
    of entries once the value is checked or printed. Deep nesting overflows the recursive
    composer. Config values need neither."""

    depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise YamlRefused(f"a YAML alias *{event.anchor}", event.start_mark,
                              "config text takes no anchors or aliases, write each value out")
        if self.depth >= MAX_YAML_DEPTH:
            raise YamlRefused(f"YAML nested deeper than {MAX_YAML_DEPTH} levels",
                              self.peek_event().start_mark,
                              "config values nest a few levels at most")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_yaml_text(text: str) -> Any:
    """`text` parsed as YAML by the bounded loader; YamlRefused or another YAMLError otherwise."""
    loader = _ConfigLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, YamlRefused):
        return f"holds {exc}"
    return f"is not valid YAML ({exc.__class__.__name__})"


def parse_override(text: str) -> tuple[str, Any]:
    """`loss.beta=2.0` -> ("loss.beta", 2.0); the value is parsed as YAML (bounded loader)."""
    if "=" not in text:
        raise ConfigError(f"override {_quoted(text)}: expected key.sub=value")
    key, raw = text.split("=", 1)
    try:
        value = load_yaml_text(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {_quoted(text)}: value {_yaml_problem(exc)}") from None
    return key.strip(), value


def read_config_text(path: Path, expected: str) -> str:
    """The text of a config file the user names, or one ConfigError line: missing, unreadable,
    larger than MAX_CONFIG_BYTES, or not UTF-8 (a UTF-8 byte-order mark is accepted)."""
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found; expected {expected}")
    try:
        with open(path, "rb") as src:
            data = src.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB; expected "
                              f"{expected}")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start}); expected {expected}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: unreadable ({exc.strerror or exc.__class__.__name__}); "
                          f"expected {expected}") from None


def read_yaml_file(path: Path, expected: str) -> Any:
    """A config file parsed as YAML (`read_config_text`), or one ConfigError line."""
    text = read_config_text(path, expected)
    try:
        return load_yaml_text(text)
    except yaml.YAMLError as exc:
        problem = _yaml_problem(exc).replace("is not valid YAML", "not valid YAML")
        raise ConfigError(f"{path}: {problem}; expected {expected}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                base: Config | None = None) -> Config:
    """Defaults <- YAML file <- `key.sub=value` overrides, then validate."""
    config = base if base is not None else Config()
    if path is not None:
        path = Path(path)
        apply_mapping(config, read_yaml_file(path, "a YAML file of config overrides") or {},
                      source=str(path))
    for text in overrides:
        set_value(config, *parse_override(text))
    validate(config)
    return config


def to_dict(config: Config) -> dict[str, dict[str, Any]]:
    return dataclasses.asdict(config)


def flat_dict(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"loss": {"beta": 1}} -> {"loss.beta": 1}: nested mappings (a config's sections, Tune's
    nesting of dotted keys) joined with dots; keys already dotted pass as they are."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_dict(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def flatten(config: Config) -> dict[str, Any]:
    """{"loss.beta": 1.0, ...}: one entry per config key (used for tracking params)."""
    return flat_dict(to_dict(config))


def from_dict(mapping: dict[str, Any]) -> Config:
    """Nested or flat (dotted) mapping -> validated Config."""
    config = Config()
    if all("." in k for k in mapping):
        for key, value in mapping.items():
            set_value(config, key, value)
    else:
        apply_mapping(config, mapping)
    validate(config)
    return config


def public_dict(config: Config) -> dict[str, dict[str, Any]]:
    """`to_dict(config)` as it may be written or logged: a password in tracking.uri is `***`
    (the run gets it from the config in memory, MLflow from its environment variables)."""
    values = to_dict(config)
    if values["tracking"]["uri"]:
        values["tracking"]["uri"] = redact_uri(values["tracking"]["uri"])
    return values


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config as YAML, atomically; `load_config` reads it back unchanged
    (a password in tracking.uri excepted: see public_dict)."""
    atomic_write_text(path, yaml.safe_dump(public_dict(config), sort_keys=False))


# ---------------------------------------------------------------- validation
def _check(condition: bool, key: str, expected: str, value: Any) -> None:
    if not condition:
        raise ConfigError(f"{key}: expected {expected}, got {_quoted(value)}")


def _one_of(key: str, value: Any, choices: tuple[str, ...]) -> None:
    _check(value in choices, key, "one of " + ", ".join(choices), value)


def validate(config: Config) -> Config:
    """Raise ConfigError for the first invalid value; return the config unchanged otherwise."""
    m, a, l, o, d, t = (config.model, config.adapter, config.loss, config.optim, config.data,
                        config.train)
    _validate_strings(config)
    _check(bool(m.name), "model.name", "a model name", m.name)
    _check(m.trainable_image_blocks >= -1, "model.trainable_image_blocks", "-1 (all) or >= 0",
           m.trainable_image_blocks)
    _check(m.trainable_text_blocks >= -1, "model.trainable_text_blocks", "-1 (all) or >= 0",
           m.trainable_text_blocks)
    _one_of("model.trainable_side", m.trainable_side, TRAINABLE_SIDES)
    _one_of("adapter.kind", a.kind, ADAPTER_KINDS)
    _check(a.hidden_dim >= 1, "adapter.hidden_dim", ">= 1", a.hidden_dim)
    _check(a.latent_dim >= 1, "adapter.latent_dim", ">= 1", a.latent_dim)
    _check(a.num_components >= 1, "adapter.num_components", "K >= 1", a.num_components)
    _check(a.decoder_hidden_dim >= 0, "adapter.decoder_hidden_dim", ">= 0", a.decoder_hidden_dim)
    _one_of("adapter.init", a.init, ADAPTER_INITS)
    if a.init == "cosine":  # two first-layer units and two decoder units carry +-cos
        _check(a.hidden_dim >= 2, "adapter.hidden_dim", ">= 2 with adapter.init=cosine",
               a.hidden_dim)
        _check(a.decoder_hidden_dim != 1, "adapter.decoder_hidden_dim",
               "0 or >= 2 with adapter.init=cosine", a.decoder_hidden_dim)
    for name in ("alpha_kl", "beta", "gamma"):
        value = getattr(l, name)
        _check(math.isfinite(value) and value >= 0, f"loss.{name}", "a finite weight >= 0", value)
    _check(math.isfinite(a.logvar_bound) and a.logvar_bound > 0, "adapter.logvar_bound",
           "a finite bound > 0", a.logvar_bound)
    _check(math.isfinite(a.init_logit_bias), "adapter.init_logit_bias", "a finite number",
           a.init_logit_bias)
    _check(l.num_hard_negatives >= 1, "loss.num_hard_negatives", "N_h >= 1", l.num_hard_negatives)
    _one_of("loss.neg_sigma_target", l.neg_sigma_target, ("label", "positive"))
    _one_of("loss.reduction", l.reduction, ("pair_mean", "per_query", "balanced"))
    _one_of("loss.neg_columns", l.neg_columns, ("all", "with_positive"))
    _one_of("loss.backbone_grad", l.backbone_grad, BACKBONE_GRADS)
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
    _check(0 <= t.seed <= MAX_SEED, "train.seed", f"0 to {MAX_SEED}", t.seed)
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
    return MAX_SPLIT_PIXEL_BYTES // (3 * image_size * image_size)


def _validate_synthetic_sizes(d: DataConfig) -> None:
    _check(8 <= d.image_size <= MAX_IMAGE_SIZE, "data.image_size",
           f"8 to {MAX_IMAGE_SIZE} pixels", d.image_size)
    most = max_synthetic_images(d.image_size)
    for key, count in (("data.num_train", d.num_train), ("data.num_test", d.num_test)):
        _check(1 <= count <= most, key,
               f"1 to {most:,} images of {d.image_size}x{d.image_size} pixels (a synthetic split "
               f"is held in memory: at most {MAX_SPLIT_PIXEL_BYTES >> 30} GiB of pixels)", count)
    _check(1 <= d.captions_per_image <= MAX_CAPTIONS_PER_IMAGE, "data.captions_per_image",
           f"1 to {MAX_CAPTIONS_PER_IMAGE}", d.captions_per_image)


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
        types = _section_types(section)
        for name, value in values.items():
            if isinstance(value, str) and not value.strip():
                optional = type(None) in typing.get_args(types[name])
                _check(False, f"{section}.{name}",
                       "a non-empty value" + (" or null for the default" if optional else ""),
                       value)
