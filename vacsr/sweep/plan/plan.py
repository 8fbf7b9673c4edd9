"""SweepPlan: everything a sweep run needs, resolved and checked once before any trial starts.

Each dataset's Config is built here from plain values (the kind's protocol, the profile, the
user's --set, each parsed once by the CLI), validated, and handed to the trials as an object
(`tune.with_parameters`); the Tune search space holds only the suggested values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vacsr.config import DEFAULT_METHOD, Config, from_dict, set_value, validate
from vacsr.data.synthetic_layout import SyntheticSizes
from vacsr.errors import ConfigError
from vacsr.methods.registry import method_of
from vacsr.records.names import REHEARSAL_TAG
from vacsr.sweep.plan.folders import join_storage, optuna_url
from vacsr.sweep.spec.kind import SweepKind
from vacsr.sweep.spec.space import Domain

PAPER_DECAY_EPOCH, PAPER_EPOCHS = 15, 25  # a step schedule decays at epoch 15 of 25 (C.2)
# Optuna's TPE draws at random until this many trials are told (its default n_startup_trials);
# which draws wait for earlier trials follows from it (vacsr/sweep/search/optuna_searcher.py)
STARTUP_TRIALS = 10
# with N trials of a dataset at once, trial k's draw reads trials 0..k-N-DRAW_SLACK (--draw-slack)
DRAW_SLACK = 0


@dataclass
class SweepPlan:
    kind: SweepKind
    name: str
    configs: dict[str, Config]  # dataset -> the base config of all its runs
    spaces: dict[str, dict[str, Domain]]  # dataset -> searched keys only
    storage: Path  # absolute sweep folder
    tracking_uri: str
    trials: int = 24
    seeds: tuple[int, ...] = (1, 2, 3)
    sampler_seed: int = 0
    startup_trials: int = STARTUP_TRIALS  # --startup-trials: told trials before TPE models them
    draw_slack: int = DRAW_SLACK  # --draw-slack: trials a draw may run ahead of trial k-N's end
    resume: bool = False
    parallel: int | None = None  # datasets searched at once; None: as many as the cluster holds
    # trials of one dataset at once (N). The table is a function of the command and N
    # (vacsr/sweep/search/asha.py, optuna_searcher.py); None: the cluster's trial slots divided
    # among the units searched at once, fixed at the sweep's start (`sweep_parallelism`)
    concurrent_trials: int | None = None
    free_running: bool = False  # --free-running: no waits, a table that depends on timing
    trial_cpus: float = 1.0  # a trial actor that only drives a TorchTrainer (runs of 2+ workers)
    ray_storage: str = ""  # Tune/Train experiments + checkpoints: path or s3:// gs:// URI
    optuna_url: str = ""  # Optuna RDB storage; default sqlite in the sweep folder
    ray_address: str | None = None  # None: RAY_ADDRESS, else a local Ray instance of its own
    ray_dashboard: bool = False  # the local instance's dashboard (--ray-dashboard)
    eval_actors: int = 1  # EvalPool actors scoring each final checkpoint's test splits
    verbose: bool = False
    # the memory a worker's device has (--device-memory-gib); None: the calibration's GPU, if any
    device_memory_gib: float | None = None
    # what the embedded profile's synthetic data holds (images per class, ImageNet's classes);
    # None: real data
    synthetic: SyntheticSizes | None = None
    recalibrate: bool = False  # measure the step costs even where kept (--recalibrate)
    methods: tuple[str, ...] = (DEFAULT_METHOD,)  # --methods (vacsr/methods/registry.py)
    # --rehearse: the time scale of a rehearsal (training replaced by the cost model's waits,
    # vacsr/sweep/rehearsal/); None: a real sweep
    rehearse: float | None = None
    clocks: dict[str, Any] = field(default_factory=dict)  # unit -> its rehearsal's UnitClock

    @property
    def datasets(self) -> list[str]:
        """The sweep's units, each searched and reported on its own: a dataset's name, or
        `<dataset>.<method>` when the sweep compares methods (`unit_name`)."""
        return list(self.configs)

    def dataset_of(self, unit: str) -> str:
        """The dataset a unit trains on."""
        return self.configs[unit].data.dataset

    def method_of(self, unit: str) -> str:
        """The method a unit runs (its config's adapter.kind: vacsr/methods/)."""
        return self.configs[unit].adapter.kind

    @property
    def data_names(self) -> list[str]:
        """The datasets the units train on, each once, in order."""
        return list(dict.fromkeys(self.dataset_of(unit) for unit in self.configs))

    def trials_of(self, unit: str) -> int:
        """A unit's trials: the sweep's, or 1 where nothing is searched (zero-shot CLIP, every
        key fixed): more trials would run the same configuration again."""
        return self.trials if self.spaces[unit] else 1

    def seeds_of(self, unit: str) -> tuple[int, ...]:
        """A unit's final seeds: the sweep's, or the first alone for a method that trains
        nothing (its one evaluation: no seed changes it)."""
        return self.seeds if method_of(self.method_of(unit)).trained else self.seeds[:1]

    @property
    def run_tags(self) -> dict[str, str]:
        """The tags every MLflow run of the sweep carries: a rehearsal's time scale."""
        return {REHEARSAL_TAG: f"{self.rehearse:g}"} if self.rehearse else {}

    @property
    def ray_root(self) -> str:
        """Where Tune/Train keep experiments and checkpoints: --ray-storage, else the sweep
        folder."""
        return self.ray_storage or str(self.storage)

    def ray_path(self, *parts: str) -> str:
        return join_storage(self.ray_root, *parts)

    @property
    def optuna_storage_url(self) -> str:
        return self.optuna_url or optuna_url(self.storage)


def step_decay_epoch(epochs: int) -> int:
    """Epoch of the step decay: 15 of the paper's 25 (C.2); a shorter run decays at the same
    fraction, 15/25 = 60% of its epochs, rounded, at least 1."""
    if epochs >= PAPER_EPOCHS:
        return PAPER_DECAY_EPOCH
    return max(1, round(epochs * PAPER_DECAY_EPOCH / PAPER_EPOCHS))


def build_config(layers: list[dict[str, Any]], user_keys: set[str]) -> Config:
    """A Config from dotted-key layers applied in order (later wins), validated. A step schedule
    gets its decay epoch from the run's epochs unless the user set optim.decay_epochs."""
    values: dict[str, Any] = {}
    for layer in layers:
        values.update(layer)
    config = from_dict(values)
    if config.optim.schedule == "step" and "optim.decay_epochs" not in user_keys:
        set_value(config, "optim.decay_epochs", [step_decay_epoch(config.train.epochs)])
        validate(config)
    return config


def trains_in_trial(train) -> bool:
    """A run of one worker trains in its Tune trial actor (vacsr/sweep/search/trial_run.py); a
    run of several is a Ray Train TorchTrainer whose workers reserve their own resources."""
    return train.workers == 1


def local_resources(gpus: bool) -> dict[str, float]:
    """What a local Ray instance of the sweep's has: this machine's CPUs, and with `gpus` (trials
    that take GPUs) the GPUs torch sees; no autoscaler grows it."""
    import os

    have = {"CPU": float(os.cpu_count() or 1)}
    if gpus:
        import torch

        have["GPU"] = float(torch.cuda.device_count())
    return have


def trial_resources(train, trial_cpus: float) -> dict[str, float]:
    """What a trial's actor reserves: the worker's share where it trains itself, else
    `trial_cpus` to drive the TorchTrainer."""
    if not trains_in_trial(train):
        return {"CPU": trial_cpus}
    resources = {"CPU": train.cpus_per_worker}
    if train.gpus_per_worker > 0:
        resources["GPU"] = train.gpus_per_worker
    return resources


def trial_needs(train, trial_cpus: float) -> dict[str, float]:
    """All one trial reserves at once: its actor, plus its Train workers where it drives them."""
    if trains_in_trial(train):
        return trial_resources(train, trial_cpus)
    needs = {"CPU": trial_cpus + train.workers * train.cpus_per_worker}
    if train.gpus_per_worker > 0:
        needs["GPU"] = train.workers * train.gpus_per_worker
    return needs


def short_of(needs: dict[str, float], resources: dict) -> dict[str, tuple[float, float]]:
    """Resource -> (what one trial needs, what `resources` hold) where they hold too little: such
    a trial is never scheduled, and Ray waits for it without a word."""
    return {name: (need, resources.get(name, 0.0)) for name, need in needs.items()
            if need > resources.get(name, 0.0) + 1e-9}


def concurrency(resources: dict, workers: int, cpus_per_worker: float, gpus_per_worker: float,
                driver_cpus: float = 1.0) -> int:
    """Trials `resources` (Ray's cluster resources) hold at once: each needs its driver plus its
    workers."""
    limit = resources.get("CPU", 1) // (driver_cpus + workers * cpus_per_worker)
    if gpus_per_worker > 0:
        limit = min(limit, resources.get("GPU", 0) // (workers * gpus_per_worker))
    return max(1, int(limit))


def trial_slots(plan: SweepPlan, resources: dict) -> int:
    """Trials of the sweep that `resources` (Ray's cluster resources) hold at once."""
    train = plan.configs[plan.datasets[0]].train
    return concurrency(resources, train.workers, train.cpus_per_worker, train.gpus_per_worker,
                       0.0 if trains_in_trial(train) else plan.trial_cpus)


def sweep_parallelism(plan: SweepPlan, resources: dict) -> tuple[int, int]:
    """(datasets searched at once, concurrent trials per dataset). Their product never exceeds the
    trials the cluster holds, so no trial actor waits forever for its Train workers. Without
    --concurrent-trials, as many datasets as the slots allow are searched at once and the slots
    are divided among them (no more than a dataset's trials each); with it, a dataset runs at
    most that many trials at once, and slots beyond what the datasets take stay idle. A
    --concurrent-trials the cluster cannot hold is refused (ConfigError, one line), by --plan as
    by the sweep: the table depends on the number, so it is never lowered quietly."""
    slots = trial_slots(plan, resources)
    if plan.concurrent_trials is not None and plan.concurrent_trials > slots:
        raise ConfigError(f"--concurrent-trials {plan.concurrent_trials}: this cluster holds "
                          f"{slots} trials at once, and the table depends on the number; ask "
                          "for at most that, or leave it out to have the cluster choose")
    if plan.concurrent_trials is None:
        parallel = max(1, min(plan.parallel or slots, slots, len(plan.datasets)))
        most = max(plan.trials_of(d) for d in plan.datasets)
        return parallel, max(1, min(slots // parallel, most))
    per_dataset = max(1, plan.concurrent_trials)
    parallel = max(1, min(plan.parallel or slots, slots // per_dataset, len(plan.datasets)))
    return parallel, per_dataset
