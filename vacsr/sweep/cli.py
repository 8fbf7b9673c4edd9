"""Command line of the sweep scripts (sweeps/*.py); every check runs before any trial starts."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from vacsr.errors import ConfigError, VacsrError

BASE2NOVEL = ("imagenet", "caltech101", "oxford_pets", "stanford_cars", "oxford_flowers",
              "food101", "fgvc_aircraft", "sun397", "dtd", "eurosat", "ucf101")
# Per kind: datasets, task, selection metric, the fixed training protocol (paper appendix C.2) and
# the kind's additions to the embedded profile. Order: protocol, embedded, --epochs, --set (wins);
# --range can still search any key.
KINDS = {
    # MMA's recipe (Yang et al., 2024): cosine; blocks and epochs are searched (C.2)
    "base2novel": {"datasets": BASE2NOVEL, "metric": "val/acc", "task": "classification",
                   "protocol": {"optim.schedule": "cosine"},
                   "embedded": {"train.epochs": 1}},  # searched 4-8 by the embedded ranges
    # C.2: first 2 image and 3 text blocks, 5 epochs, cosine annealing
    "domain_generalization": {"datasets": ("imagenet",), "metric": "val/acc",
                              "task": "classification",
                              "protocol": {"model.trainable_image_blocks": 2,
                                           "model.trainable_text_blocks": 3,
                                           "train.epochs": 5, "optim.schedule": "cosine"}},
    # C.2 (PCME++ recipe): AdamP, lr 5e-4 decayed to 10% at epoch 15 (step_decay_epoch), 25 epochs
    "retrieval": {"datasets": ("coco",), "metric": "val/rsum", "task": "retrieval",
                  "protocol": {"optim.schedule": "step", "optim.lr": 5e-4,
                               "optim.decay_factor": 0.1, "train.epochs": 25},
                  "embedded": {"train.epochs": 1}},
}
EMBEDDED = {"adapter.hidden_dim": 64, "train.batch_size": 32}  # no --data-root: tiny runs
PAPER_DECAY_EPOCH, PAPER_EPOCHS = 15, 25  # retrieval, appendix C.2


def step_decay_epoch(epochs: int) -> int:
    """Epoch of the step decay: 15 of the paper's 25 (C.2); a shorter run decays at the same
    fraction, 15/25 = 60% of its epochs, rounded, at least 1."""
    if epochs >= PAPER_EPOCHS:
        return PAPER_DECAY_EPOCH
    return max(1, round(epochs * PAPER_DECAY_EPOCH / PAPER_EPOCHS))


def build_parser(kind: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=f"vacsr {kind} sweep (Ray Tune + Optuna + MLflow)")
    p.add_argument("--datasets", help="comma-separated subset (default: all of this sweep)")
    env = os.environ.get
    p.add_argument("--data-root", default=env("VACSR_DATA_ROOT"),
                   help="folder with the datasets in their real layouts (env VACSR_DATA_ROOT); "
                        "default: synthetic data generated under the sweep folder")
    p.add_argument("--model", default="vacsr-tiny", help="open_clip model name")
    p.add_argument("--pretrained", help="open_clip tag or local weights file")
    p.add_argument("--trials", type=int, help="trials per dataset (default 2 embedded, 24 real)")
    p.add_argument("--epochs", type=int, help="epochs when not searched (default: the paper's "
                                              "protocol, 5 for DG; 1 embedded otherwise)")
    p.add_argument("--shots", type=int, help="few-shot K (default 16; embedded 2)")
    p.add_argument("--seeds", help="seeds of the final re-runs (default 1,2,3; embedded: 1)")
    p.add_argument("--name", default=f"{kind}", help="sweep name (its folder and MLflow run)")
    p.add_argument("--storage", default=env("VACSR_SWEEP_STORAGE", "sweeps_out"),
                   help="sweep folder; on a multi-node cluster a path every node mounts "
                        "(env VACSR_SWEEP_STORAGE)")
    p.add_argument("--ray-storage", default=env("VACSR_RAY_STORAGE", ""),
                   help="Tune/Train experiments and checkpoints: a shared path or an s3:// gs:// "
                        "URI (env VACSR_RAY_STORAGE; default: the sweep folder)")
    p.add_argument("--optuna-storage", default=env("VACSR_OPTUNA_STORAGE", ""),
                   help="Optuna RDB URL, e.g. postgresql://... (env VACSR_OPTUNA_STORAGE; "
                        "default: sqlite in the sweep folder)")
    p.add_argument("--tracking-uri", default=env("MLFLOW_TRACKING_URI"),
                   help="MLflow URI (env MLFLOW_TRACKING_URI; "
                        "default: sqlite:///<storage>/mlflow.db)")
    p.add_argument("--ray-address", default=env("RAY_ADDRESS"),
                   help="Ray cluster to join (env RAY_ADDRESS, set by `ray job submit`; "
                        "default: start a local Ray)")
    p.add_argument("--workers", type=int, default=1, help="Ray Train workers per trial")
    p.add_argument("--gpus-per-worker", type=float, default=0.0)
    p.add_argument("--cpus-per-worker", type=float,
                   help="CPUs per Ray Train worker (default 1; embedded 0.5: tiny runs)")
    p.add_argument("--trial-cpus", type=float,
                   help="CPUs held by each trial's driver actor (default 1; embedded 0.1)")
    p.add_argument("--parallel-datasets", type=int, default=0,
                   help="datasets searched at once (default: as many as the cluster holds)")
    p.add_argument("--range", action="append", default=[], metavar="KEY=KIND:LOW:HIGH",
                   help="override a search range, e.g. loss.beta=log:0.5:2")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every run")
    p.add_argument("--resume", action="store_true", help="continue a sweep whose driver died")
    p.add_argument("--seed", type=int, default=0, help="Optuna sampler seed")
    return p


def _datasets(kind: str, text: str | None) -> list[str]:
    known = KINDS[kind]["datasets"]
    names = [d.strip() for d in text.split(",") if d.strip()] if text else list(known)
    for name in names:
        if name not in known and not (kind == "retrieval" and name == "synthetic"):
            raise ConfigError(f"--datasets: unknown dataset {name!r} (known: {', '.join(known)})")
    if not names:
        raise ConfigError("--datasets: expected at least one dataset name")
    return names


def _embedded(args, storage: Path, kind: str, datasets: list[str]) -> tuple[Path, str]:
    """No --data-root: synthetic data in the real layouts and the pretrained tiny CLIP."""
    from vacsr.data.generate import generate_all
    from vacsr.model.pretrain import pretrain_clip

    root = storage / "data"
    names = [d for d in datasets if d != "synthetic"]
    if kind == "domain_generalization":
        names += ["imagenetv2", "imagenet_sketch", "imagenet_a", "imagenet_r"]
    if not (root / ".generated").is_file():
        print(f"writing synthetic datasets in their real layouts under {root}", flush=True)
        generate_all(root, datasets=names, per_class=(4, 3, 2))
        (root / ".generated").write_text("ok\n")
    weights = storage / "tiny-clip.pt"
    if args.pretrained is None and args.model == "vacsr-tiny" and not weights.is_file():
        print(f"pretraining the tiny CLIP on synthetic pairs -> {weights}", flush=True)
        pretrain_clip(weights, progress=False)
    return root, args.pretrained or str(weights)


def _ray_storage(text: str) -> str:
    """A URI pyarrow can open (s3://, gs://, file://...) as given; a path made absolute."""
    if not text:
        return ""
    if "://" not in text:
        return str(Path(text).expanduser().resolve())
    from vacsr.sweep.driver import storage_filesystem

    try:
        storage_filesystem(text)
    except Exception as exc:  # pyarrow raises ArrowInvalid / ValueError / OSError by scheme
        raise ConfigError(f"--ray-storage {text!r}: not a storage URI pyarrow can open "
                          f"({str(exc).splitlines()[0]})") from None
    return text


def _or(value, default):
    return default if value is None else value


def _assign(values: dict) -> list[str]:
    return [f"{key}={value}" for key, value in values.items()]


def _overrides(args, kind: str, dataset: str, root: Path, pretrained: str | None,
               embedded: bool) -> list[str]:
    """Config overrides of one dataset: sweep plumbing, the kind's protocol, the embedded
    profile, --epochs, the step decay epoch, then --set (last, so it wins)."""
    entry = KINDS[kind]
    out = [f"data.task={entry['task']}", f"data.dataset={dataset}", f"data.root={root}",
           f"model.name={args.model}", "train.progress=false", "train.resume=true",
           f"train.workers={args.workers}", f"train.gpus_per_worker={args.gpus_per_worker}",
           f"train.cpus_per_worker={_or(args.cpus_per_worker, 0.5 if embedded else 1.0)}",
           "train.max_failures=1"]
    if pretrained:
        out.append(f"model.pretrained={pretrained}")
    if entry["task"] == "classification":
        out += ["model.use_gpo=false", f"data.shots={args.shots or (2 if embedded else 16)}",
                f"data.subsample_classes={'base' if kind == 'base2novel' else 'all'}"]
    out += _assign(entry["protocol"])
    if embedded:
        out += _assign({**EMBEDDED, **entry.get("embedded", {})})
    if args.epochs:
        out.append(f"train.epochs={args.epochs}")
    return out + _step_decay(out, list(args.set)) + list(args.set)


def _step_decay(fixed: list[str], user: list[str]) -> list[str]:
    """optim.decay_epochs of a step schedule from the run's epochs (--set included), unless
    --set gives it. A searched train.epochs (--range) keeps the base config's decay epoch."""
    from vacsr.config import load_config, parse_override

    if any(parse_override(text)[0] == "optim.decay_epochs" for text in user):
        return []
    config = load_config(overrides=fixed + user)  # bad --set values fail here, before any trial
    if config.optim.schedule != "step":
        return []
    return [f"optim.decay_epochs=[{step_decay_epoch(config.train.epochs)}]"]


def spec_from_args(kind: str, args):
    """Parse and check everything (names, ranges, config, MLflow) into a SweepSpec."""
    from vacsr.config import load_config
    from vacsr.sweep.driver import SweepSpec, prepare_tracking, sweep_folder
    from vacsr.sweep.space import parse_range, space_for

    datasets = _datasets(kind, args.datasets)
    embedded = args.data_root is None
    # the embedded default keeps runs short (4-8 epochs of a few steps, at most one trainable
    # block, where the kind's protocol does not fix them) and the lr high enough to learn in that
    # many steps; the loss weights keep the paper's search ranges
    defaults = (["train.epochs=int:4:8", "optim.lr=log:0.001:0.003",
                 "model.trainable_image_blocks=int:0:1", "model.trainable_text_blocks=int:0:1"]
                if embedded and kind != "retrieval" else [])
    fixed = KINDS[kind]["protocol"]  # the protocol's keys stay fixed unless --range names them
    ranges = {k: v for k, v in map(parse_range, defaults) if k not in fixed}
    ranges.update(parse_range(r) for r in args.range)
    for dataset in datasets:  # empty or inverted ranges fail here
        space_for(kind, dataset, ranges, workers=args.workers)
    storage = sweep_folder(args.storage, args.name)
    tracking_uri = prepare_tracking(args.tracking_uri, storage)
    try:
        seeds = tuple(int(s) for s in (args.seeds or ("1" if embedded else "1,2,3")).split(",")
                      if s.strip())
    except ValueError:
        seeds = ()
    if not seeds:
        raise ConfigError(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    trial_cpus = _or(args.trial_cpus, 0.1 if embedded else 1.0)
    if trial_cpus <= 0 or args.parallel_datasets < 0:
        raise ConfigError("--trial-cpus must be > 0 and --parallel-datasets >= 0, got "
                          f"{trial_cpus} and {args.parallel_datasets}")
    root, pretrained = (_embedded(args, storage, kind, datasets) if embedded
                        else (Path(args.data_root).expanduser().resolve(), args.pretrained))
    overrides = {d: _overrides(args, kind, d, root, pretrained, embedded) for d in datasets}
    for dataset, values in overrides.items():
        load_config(overrides=values)  # bad --set values fail before any trial
    spec = SweepSpec(kind=kind, name=args.name, datasets=datasets, overrides=overrides,
                     metric=KINDS[kind]["metric"], storage=storage, tracking_uri=tracking_uri,
                     trials=args.trials or (2 if embedded else 24), seeds=seeds,
                     space_overrides=ranges, sampler_seed=args.seed, resume=args.resume,
                     parallel=args.parallel_datasets, trial_cpus=trial_cpus,
                     ray_storage=_ray_storage(args.ray_storage), optuna_url=args.optuna_storage,
                     ray_address=args.ray_address or None)
    if spec.optuna_url:
        from vacsr.sweep.driver import optuna_storage

        optuna_storage(spec)  # an unreachable study database fails here, not in a trial
    return spec


def main(kind: str, argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    args = build_parser(kind).parse_args(argv)
    start = time.time()
    try:
        spec = spec_from_args(kind, args)
        from vacsr.sweep.run import mlflow_ui_hint, run_sweep

        run_sweep(spec)
    except VacsrError as exc:
        print(f"{kind}: error: {exc}", file=sys.stderr)
        return 2
    print(f"sweep {spec.name} done in {time.time() - start:.0f} s; results in {spec.storage}")
    print(f"open the MLflow UI: {mlflow_ui_hint(spec.tracking_uri)}")
    return 0
