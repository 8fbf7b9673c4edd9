"""VACSR training: one run's lifecycle (`Trainer.fit`), in this process (CPU or one GPU) or as a
Ray Train worker's share of a run (the hooks of vacsr/train/run_hooks.py say which). The run's
metrics logger (MLflow) is its caller's to open: this package imports no tracking code.

Every epoch reseeds from (seed, epoch), evaluates, and writes the checkpoint atomically, so a run
that is stopped and started again with the same output_dir continues and ends with the same result.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable

import torch
from torch.utils.data import TensorDataset
from tqdm import tqdm

from vacsr.atomic import atomic_write_json
from vacsr.compute_device import resolve_device
from vacsr.config import Config, flatten, public_dict, save_config
from vacsr.data.loader import make_loader
from vacsr.data.sampler import GlobalBatchSampler, require_one_batch
from vacsr.errors import CheckpointError, TrainingDiverged
from vacsr.methods.build import build_model
from vacsr.methods.registry import method_of
from vacsr.model.encoding import encode_images
from vacsr.model.prefix_cache import open_cache
from vacsr.model.vacsr import VACSRModel
from vacsr.seed import epoch_seed, seed_everything
from vacsr.task_names import SHOTS_MAX_TAG, SHOTS_MIN_TAG
from vacsr.tasks import task_type
from vacsr.train.checkpoint import (
    ARCHITECTURE_KEYS,
    TRAINABLE_KEYS,
    load_checkpoint,
    load_model_state,
)
from vacsr.train.eval_pass import evaluate_split
from vacsr.train.optim import build_optimizer, lr_factor, set_learning_rates
from vacsr.train.precision import STATE_KEY, check_resume_precision, run_precision
from vacsr.train.run_files import CHECKPOINT_FILE, CONFIG_FILE, METRICS_FILE
from vacsr.train.run_folder import FRESH_START, RESUME_HINT, lock_run_folder
from vacsr.train.run_hooks import OpenLogger, RunHooks
from vacsr.train.run_result import TrainResult

EpochCallback = Callable[[int, dict, Path], None]


class Trainer:
    """Owns model, task, data and optimiser for one run; `fit` runs the remaining epochs."""

    def __init__(self, config: Config, *, device: torch.device | None = None) -> None:
        self.config = config
        self.method = method_of(config.adapter.kind)  # a typo is one line before any data
        self.method.check_task(config.data.task)  # a classifier's head has no retrieval path
        self.method.check_config(flatten(config))  # e.g. a linear probe on a frozen CLIP
        self.device = device or resolve_device(config.train.device)
        self.precision = run_precision(self.device, config.train)
        # the data first: a broken dataset is refused in one line before seconds of model
        # building (and open_clip's notes on stderr); the splits draw from their own generators
        kind = task_type(config.data.task)
        self.splits = kind.build_splits(config.data, config.train.seed)
        if self.method.trained:  # a method that trains nothing takes no training step
            self._require_one_batch(kind)
        self.run_tags = kind.run_tags(config.data, self.splits["train"])  # MLflow tags
        self._note_fewer_shots()
        seed_everything(config.train.seed)
        self.model: VACSRModel = build_model(config).to(self.device)
        self.task = kind.for_run(self.model, config.loss, self.splits)
        # its batches then hold image features (feature_dataset), not images
        self.task.image_features_given = self.trains_on_features()
        # a method that trains nothing (zero-shot CLIP) has no optimizer: its epochs evaluate
        self.optimizer = build_optimizer(self.model, config.optim) if self.method.trained else None
        self.output_dir = Path(config.train.output_dir).expanduser().resolve()
        self.prefix_cache = open_cache(config.data)  # evaluation passes' frozen-prefix outputs
        self.history: list[dict] = []
        self.start_epoch = 0

    # ---------------------------------------------------------------- setup
    def _require_one_batch(self, kind) -> None:
        """Stop before training (here, so the Ray Train workers stop too) when the training split
        is smaller than one global batch: the sampler would yield no step and the run would save
        an untrained model as its result."""
        data = self.config.data
        size, unit, remedy = kind.train_size(data, self.splits["train"])
        require_one_batch(size, self.config.train.batch_size,
                          what=f"{data.dataset}: the training split has {size} {unit}",
                          remedy=remedy)

    def _note_fewer_shots(self) -> None:
        """Said once: the config records the shots asked for, the run's tags those it got."""
        fewest, most = self.run_tags.get(SHOTS_MIN_TAG), self.run_tags.get(SHOTS_MAX_TAG)
        if fewest is not None and fewest < self.config.data.shots:
            print(f"vacsr: note: {self.config.data.dataset}: data.shots={self.config.data.shots}"
                  f", but a class with fewer training images trains on all of them: {fewest} to "
                  f"{most} per class (tags {SHOTS_MIN_TAG} / {SHOTS_MAX_TAG})", file=sys.stderr,
                  flush=True)

    def trains_on_features(self) -> bool:
        """A method whose whole image tower is frozen, on unaugmented images (its protocol:
        vacsr/methods/method.py FROZEN_CLIP), trains on each image's feature computed once."""
        return (self.method.frozen_image_tower and not self.config.data.augment
                and self.config.data.task == "classification")

    def feature_dataset(self) -> TensorDataset:
        """(image feature (d,), label) of every training image: one pass of the frozen tower on
        the evaluation transform (what every epoch would compute again), through the prefix
        cache when the run has one, so a dataset's trials, seeds and methods share it."""
        train = self.splits["train"]
        feats = encode_images(self.model.backbone, train.images,
                              batch_size=max(self.config.train.batch_size, 64),
                              autocast=self.autocast, cache=self.prefix_cache)  # (N, d)
        return TensorDataset(feats, torch.as_tensor(train.labels))

    def train_dataset(self):
        if self.trains_on_features():
            return self.feature_dataset()
        backbone = self.model.backbone
        transform = (backbone.train_transform if self.config.data.augment
                     else backbone.eval_transform)
        return self.task.train_dataset(self.splits["train"], transform)

    def train_loader(self, epoch: int, dataset=None, rank: int = 0, world_size: int = 1):
        """Global batches shuffled from (seed, epoch), this rank's slice of each: a resumed or a
        distributed run replays exactly the batches of an uninterrupted single-process run."""
        dataset = dataset if dataset is not None else self.train_dataset()
        sampler = GlobalBatchSampler(len(dataset), global_batch=self.config.train.batch_size,
                                     rank=rank, world_size=world_size,
                                     seed=epoch_seed(self.config.train.seed, epoch))
        return make_loader(dataset, batch_size=self.config.train.batch_size,
                           batch_sampler=sampler, num_workers=self.config.data.num_workers,
                           device=self.device, collate_fn=self.task.collate(self.model.backbone))

    # ---------------------------------------------------------------- state
    @property
    def checkpoint_path(self) -> Path:
        return self.output_dir / CHECKPOINT_FILE

    def state(self, epoch: int) -> dict:
        optimizer = self.optimizer.state_dict() if self.optimizer is not None else {}
        return {"epoch": epoch, "model": self.model.state_dict(),
                "optimizer": optimizer, "history": self.history,
                "config": public_dict(self.config), STATE_KEY: self.precision.name}

    def load_state(self, state: dict, source: str | Path = "resumed checkpoint") -> None:
        """Continue from `state`; a checkpoint of another architecture or trainable set fails
        with one line naming the differing config keys (`source` names the file)."""
        missing = [key for key in ("model", "optimizer", "epoch", "history") if key not in state]
        if missing:
            raise CheckpointError(f"{source}: not a vacsr training checkpoint (no "
                                  f"{', '.join(missing)}); {FRESH_START}")
        load_model_state(self.model, state, source, self.config,
                         keys=ARCHITECTURE_KEYS + TRAINABLE_KEYS, hint=RESUME_HINT)
        check_resume_precision(state, self.precision, source)
        try:
            if self.optimizer is not None:
                self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, ValueError) as exc:
            raise CheckpointError(f"{source}: its optimizer state does not fit this config's "
                                  f"trainable parameters ({exc.__class__.__name__}); "
                                  f"{FRESH_START}") from None
        self.history = list(state["history"])
        self.start_epoch = int(state["epoch"]) + 1

    def maybe_resume(self) -> bool:
        if self.config.train.resume and self.checkpoint_path.is_file():
            self.load_state(load_checkpoint(self.checkpoint_path, self.device),
                            source=self.checkpoint_path)
            return True
        return False

    # ---------------------------------------------------------------- steps
    def autocast(self):
        return self.precision()

    def compute_loss(self, batch, gather: Callable | None = None, step_seed: int | None = None):
        """Backbone under autocast; adapter and losses in fp32 over the (gathered) global batch.

        The adapter's sampling noise is drawn from a generator reseeded with `step_seed`, so every
        rank of a distributed run draws the same noise for the same global batch."""
        with self.autocast():
            pairs = self.task.features(batch)
        if gather is not None:
            pairs = gather(pairs)
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.autocast(self.device.type,
                                                                      enabled=False):
            if step_seed is not None:
                torch.manual_seed(step_seed)
            return self.task.loss_from_pairs(pairs.float())

    def train_epoch(self, epoch: int, loader, loss_fn: Callable | None = None,
                    show_progress: bool = True) -> dict:
        """One pass over `loader`; `loss_fn(batch, step_seed)` defaults to the local loss (the
        distributed trainer passes its DDP-wrapped one)."""
        self.model.train()
        if self.optimizer is None:  # nothing trains: the epoch is its evaluation alone
            return {}
        seed_everything(epoch_seed(self.config.train.seed, epoch))
        loss_fn = loss_fn or (lambda batch, step_seed: self.compute_loss(batch, None, step_seed))
        optim, epochs, totals, steps = self.config.optim, self.config.train.epochs, {}, len(loader)
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{epochs}", leave=False, file=sys.stderr,
                   disable=not (show_progress and self.config.train.progress), mininterval=1.0)
        for step, batch in enumerate(bar):
            rates = set_learning_rates(self.optimizer, lr_factor(
                epoch + step / max(steps, 1), epochs=epochs, schedule=optim.schedule,
                decay_epochs=optim.decay_epochs, decay_factor=optim.decay_factor,
                warmup_epochs=optim.warmup_epochs))
            batch = [b.to(self.device, non_blocking=True) for b in batch]
            loss, parts = loss_fn(batch, epoch_seed(self.config.train.seed, epoch) * 10_007 + step)
            if not math.isfinite(loss_value := loss.item()):
                raise TrainingDiverged(divergence_message(epoch, step, steps, loss_value, parts,
                                                          optim.lr))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), optim.grad_clip)
            self.optimizer.step()
            for name, value in parts.items():
                totals[name] = totals.get(name, 0.0) + float(value)
            bar.set_postfix({k: f"{v / (step + 1):.4f}" for k, v in totals.items()
                             if k in ("loss", "recon", "kl", "sigma_pos", "sigma_neg")})
        if steps and (broken := first_non_finite(self.model)) is not None:
            # the loss of the last step was finite, but its update was not: stop before evaluating
            raise TrainingDiverged(f"training diverged at epoch {epoch + 1} step {steps}/{steps}: "
                                   f"its update made parameter {broken} non-finite; "
                                   f"{divergence_hint(optim.lr)}")
        metrics = {f"train/{k}": v / max(steps, 1) for k, v in totals.items()}
        metrics.update(rates if steps else {})
        return metrics

    def evaluate(self, split: str) -> dict[str, float]:
        data, task = self.splits[split], self.config.data.task
        folds = self.task.num_folds(split, len(data.images))  # retrieval test: COCO 1K too
        return evaluate_split(self.model, data, task=task, device=self.device,
                              batch_size=max(self.config.train.batch_size, 64),
                              autocast=self.autocast, precision=self.precision.scorer,
                              cache=self.prefix_cache,
                              **({"num_folds": folds} if folds else {}))

    def eval_splits(self, epoch: int) -> list[str]:
        last = epoch == self.config.train.epochs - 1
        if not last and (epoch + 1) % self.config.train.eval_every:
            return []
        names = ["val"] if "val" in self.splits else []
        if last and self.config.train.eval_test or not names:
            names.append("test")
        return names

    # ---------------------------------------------------------------- run
    def fit(self, hooks: RunHooks | None = None, callbacks: tuple[EpochCallback, ...] = (),
            open_logger: OpenLogger | None = None) -> TrainResult:
        """The run's whole lifecycle: restore, save the config, train the remaining epochs
        (evaluating, keeping the history, checkpointing each), write metrics.json. `hooks` say
        where the run runs (default: this process); `open_logger` opens the run's logger (the
        caller's MLflow run; None: none), which the rank that writes the run's files keeps."""
        hooks = hooks or RunHooks()
        hooks.restore(self)  # first: a mismatched checkpoint must not get this config beside it
        chief = hooks.rank == 0
        logger = None
        if chief:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            # before any file: a store that is not MLflow (or not writable) leaves nothing behind
            logger = hooks.open_logger(self, open_logger)
        try:
            if chief:
                save_config(self.config, self.output_dir / CONFIG_FILE)
            self._epochs(hooks, (*callbacks, logger) if logger else callbacks)
        except BaseException as exc:  # the MLflow run is not left RUNNING; Ctrl-C, SIGTERM
            # (vacsr.stop.Stopped) and SystemExit (Tune ends a trial ASHA stopped with it, inside
            # tune.report) close it as KILLED: stopped, not failed
            if logger is not None:
                stopped = isinstance(exc, (KeyboardInterrupt, SystemExit))
                logger.fail("KILLED" if stopped else "FAILED")
            raise
        result = TrainResult.of_history(self.history, self.checkpoint_path)
        if chief:
            write_json(self.output_dir / METRICS_FILE,
                       {"final": result.final_metrics, "history": self.history})
            if logger is not None:
                logger.finish(result, self.output_dir)
        return result

    def _epochs(self, hooks: RunHooks, callbacks: tuple[EpochCallback, ...]) -> None:
        chief, resumed_from = hooks.rank == 0, self.start_epoch
        dataset, loss_fn = self.train_dataset(), hooks.loss_fn(self)
        for epoch in range(self.start_epoch, self.config.train.epochs):
            hooks.before_epoch(epoch)
            loader = self.train_loader(epoch, dataset, rank=hooks.rank,
                                       world_size=hooks.world_size)
            metrics = {"epoch": epoch + 1, **self.train_epoch(epoch, loader, loss_fn=loss_fn,
                                                               show_progress=chief)}
            if resumed_from and hooks.marks_resume:
                metrics["resumed_from_epoch"] = resumed_from  # visible in the history and MLflow
            if chief:
                for split in self.eval_splits(epoch):
                    metrics.update({f"{split}/{k}": v for k, v in self.evaluate(split).items()})
                if self.prefix_cache is not None:  # cumulative: how much the cache served
                    metrics.update(self.prefix_cache.stats.as_metrics())
                self.history.append(metrics)
            checkpoint = hooks.after_epoch(self, epoch, metrics)
            if chief:
                for callback in callbacks:
                    callback(epoch, metrics, checkpoint)
            hooks.after_logging(self, epoch, metrics)
        if resumed_from >= self.config.train.epochs and self.history:
            hooks.after_restored_finished_run(self)


LOSS_TERMS = ("kl", "recon", "sigma_pos", "sigma_neg", "sigmoid")  # the parts a loss sums


def divergence_message(epoch: int, step: int, steps: int, loss: float, parts: dict,
                       lr: float) -> str:
    """One line: where the loss went non-finite, which of its parts did, and what to change."""
    bad = {name: float(value) for name, value in parts.items() if not math.isfinite(float(value))}
    bad["loss"] = loss
    # the terms the loss sums, not the sigma_hat diagnostics; the total when every term is finite
    names = ([n for n in bad if n in LOSS_TERMS] or [n for n in bad if n != "loss"]
             or ["loss"])
    shown = ", ".join(f"{name}={bad[name]}" for name in names)
    return (f"training diverged at epoch {epoch + 1} step {step + 1}/{steps}: non-finite loss "
            f"parts {shown}; {divergence_hint(lr)}")


def divergence_hint(lr: float) -> str:
    return (f"lower optim.lr (now {lr:g}) or check the loss weights (loss.alpha_kl, loss.beta, "
            "loss.gamma)")


def first_non_finite(model: torch.nn.Module) -> str | None:
    """The name of the first trainable parameter holding a nan or inf, else None."""
    for name, param in model.named_parameters():
        if param.requires_grad and not torch.isfinite(param).all():
            return name
    return None


def write_json(path: Path, payload: dict) -> None:
    atomic_write_json(path, payload)


def train(config: Config, callbacks: tuple[EpochCallback, ...] = (),
          open_logger: OpenLogger | None = None) -> TrainResult:
    """Build a Trainer from `config` and run it to the last epoch (logged where `open_logger`
    opens a logger), holding its output folder (a second process training there is refused;
    run_folder.py)."""
    with lock_run_folder(config):
        return Trainer(config).fit(callbacks=callbacks, open_logger=open_logger)
