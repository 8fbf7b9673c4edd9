"""The configuration's schema: the typed dataclasses, which hold every default, the choices of
the keys that take one of a few values, and the bounds of the synthetic data.

Defaults follow the paper (sec. 3, appendix C.2, E.1-E.3); validation.py checks the values.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# the method a config runs unless `adapter.kind` names another, and a sweep unless --methods
# does: the paper's own (vacsr/methods/vacsr_adapter.py declares it under this name)
DEFAULT_METHOD = "vacsr"


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

ADAPTER_INITS = ("random", "cosine")
TRAINABLE_SIDES = ("first", "last")
BACKBONE_GRADS = ("all", "recon")
# how L_recon and L_sigma are averaged (LossConfig.reduction); vacsr/model/losses.py computes each
LOSS_REDUCTIONS = ("pair_mean", "per_query", "balanced")
# which columns L_sigma^N sums over (vacsr/model/losses.py): every column, or those with a positive
LOSS_NEG_COLUMNS = ("all", "with_positive")


@dataclass
class AdapterConfig:
    """The method's head: the variational similarity adapter (paper section 3.1), the sigmoid
    baseline, or a compared method's (vacsr/methods/)."""

    # the method: a name in vacsr/methods/registry.py's METHODS
    kind: str = DEFAULT_METHOD
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
    # (sec. 3.1, app. C.2). docs/method.md, "The loss as implemented", measures both.
    init: str = "cosine"
    # CLIP-Adapter (vacsr/methods/clip_adapter.py): the bottleneck's reduction (d -> d / r) and
    # the residual ratio alpha blending the adapted image feature with CLIP's (its paper's 4, 0.2)
    reduction: int = 4
    residual_ratio: float = 0.2
    # CoOp (vacsr/methods/coop.py): M learned context tokens, started at a phrase's own word
    # embeddings (M its token count; CoCoOp's base-to-novel setting) or "random" (N(0, 0.02^2))
    context_tokens: int = 4
    context_init: str = "a photo of a"
    # MMA (vacsr/methods/mma.py): adapters on the highest `mma_blocks` blocks of each tower
    # (-1: its paper's share, the highest 7 of every 12: ViT-B/16's blocks 5-11), meeting in a
    # shared space of `mma_dim`, added with scale `mma_scale` (its paper's 32 and 0.001)
    mma_blocks: int = -1
    mma_dim: int = 32
    mma_scale: float = 0.001
    # MaPLe (vacsr/methods/maple.py): prompts in the first `maple_depth` blocks of both towers
    # (-1: its paper's share, J = 9 of every 12 blocks)
    maple_depth: int = -1


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
    # the frozen prefix's outputs of evaluation passes (vacsr/model/prefix_cache.py), shared by
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
    # "auto" | "cpu" | "cuda" | "cuda:N" (vacsr/compute_device.py); under Ray "cpu" keeps the
    # tensors on the CPU even where GPUs are reserved, and "auto" trains on the GPU Ray assigns
    device: str = "auto"
    amp: bool = True  # bf16 autocast (paper C.2) on CUDA; on a CPU only with amp_on_cpu
    # bf16 autocast on a CPU as well: the GPU's precision path where no GPU is (tests); off by
    # default, slower than fp32 on the CPUs measured
    # (docs/performance.md, "Mixed precision on a CPU")
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
