"""A sweep script's flags to a checked SweepPlan: every check runs before any trial starts.

Each flag's text is parsed exactly once here (--set values by `vacsr.config.parse_override`,
--range by `parse_range`); from then on configs travel as objects.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

from vacsr import config as cfg
from vacsr.errors import ConfigError
from vacsr.help_format import DefaultsHelp, flag_error, nonempty
from vacsr.methods.registry import METHODS
from vacsr.records.uri import check_tracking_uri, resolve_tracking_uri
from vacsr.sweep.plan.folders import (
    embedded_data,
    embedded_weights,
    sweep_folder,
)
from vacsr.sweep.plan.inputs import (
    check_datasets,
    check_devices,
    check_model,
    check_pretrained,
    check_ray_address,
    check_ray_storage,
    check_sweep_name,
    note_fewer_shots,
)
from vacsr.sweep.plan.methods import (
    check_method_keys,
    ignored_settings,
    parse_methods,
    unit_configs,
)
from vacsr.sweep.plan.plan import SweepPlan
from vacsr.sweep.plan.studies import check_optuna_storage
from vacsr.sweep.spec.kind import SweepKind, sweep_script
from vacsr.sweep.spec.space import (
    Domain,
    check_free_ranges,
    fixed_by,
    parse_range,
    tower_depths,
)
from vacsr.task_names import SWEEP_RUN_SETTINGS

PROFILE = Path(__file__).with_name("embedded.yaml")
# the paper's defaults where neither the profile nor a flag gives a value
DEFAULTS = {"trials": 24, "seeds": [1, 2, 3], "shots": 16, "cpus_per_worker": 1.0,
            "trial_cpus": 1.0, "model": "vacsr-tiny"}


class OneLineParser(argparse.ArgumentParser):
    """Bad flags end in one line (`vacsr: error: ...`) and exit 2, like every other bad input."""

    def error(self, message: str):
        self.exit(2, f"vacsr: error: {flag_error(self.prog, message)}\n")


def _positive(cast):
    def check(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:  # nan too
            raise argparse.ArgumentTypeError(f"expected a value > 0, got {text!r}")
        if math.isinf(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        return value
    check.__name__ = cast.__name__
    return check


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value <= cfg.MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to {cfg.MAX_SEED}, got {text}")
    return value


def _seed_list(text: str) -> tuple[int, ...]:
    """--seeds: comma-separated seeds, each in the range every seeded library takes."""
    try:
        return tuple(dict.fromkeys(_seed(part) for part in nonempty(text).split(",")))
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (in {text!r})" if text.strip() else str(exc)
                                         ) from None


def _sweep_name(text: str) -> str:
    try:
        return check_sweep_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _description(kind: SweepKind, profile: dict[str, Any]) -> str:
    seeds = ",".join(str(s) for s in profile.get("seeds", DEFAULTS["seeds"]))
    return (f"vacsr {kind.name} sweep (Ray Tune + Optuna + MLflow). Without --data-root it runs "
            f"the embedded profile ({PROFILE.relative_to(PROFILE.parents[3])}): synthetic data in "
            f"the real layouts, the {profile.get('model')} model pretrained on synthetic pairs, "
            f"{profile.get('trials')} trials per dataset, seeds {seeds}, a local Ray and SQLite "
            "MLflow in the sweep folder. With --data-root the defaults are the paper's.")


def build_parser(kind: SweepKind) -> argparse.ArgumentParser:
    profile = load_profile(kind)

    def default(key: str) -> str:  # the paper's default, then the embedded profile's
        paper, embedded = DEFAULTS[key], profile.get(key, DEFAULTS[key])
        text = lambda v: ",".join(map(str, v)) if isinstance(v, list) else v  # noqa: E731
        return f"default {text(paper)}; without --data-root {text(embedded)}"

    p = OneLineParser(prog=sweep_script(kind.name), description=_description(kind, profile),
                      formatter_class=DefaultsHelp)
    env = lambda name: os.environ.get(name) or None  # noqa: E731 (an empty variable is unset)
    p.add_argument("--datasets", type=nonempty,
                   help=f"comma-separated subset of {', '.join(kind.datasets)} (default: all)")
    p.add_argument("--data-root", type=nonempty, default=env("VACSR_DATA_ROOT"),
                   help="folder with the datasets in their real layouts (env VACSR_DATA_ROOT); "
                        "default: the embedded profile, synthetic data under the sweep folder")
    p.add_argument("--model", type=nonempty, help="open_clip model name (default vacsr-tiny)")
    p.add_argument("--pretrained", type=nonempty,
                   help="open_clip tag or local weights file (default: the model's own "
                        "initialisation; without --data-root the tiny CLIP pretrained once per "
                        "machine)")
    p.add_argument("--methods", type=nonempty,
                   help="comma-separated methods to run under the same budget, or all: "
                        f"{', '.join(METHODS)} (default: vacsr alone); more than one adds "
                        "report/comparison.md")
    p.add_argument("--trials", type=_positive(int),
                   help=f"trials per dataset ({default('trials')})")
    p.add_argument("--epochs", type=_positive(int),
                   help="epochs of every run, as --set train.epochs=N: fixed, never searched "
                        "(default: the config's)")
    p.add_argument("--shots", type=_positive(int), help=f"few-shot K ({default('shots')})")
    p.add_argument("--seeds", type=_seed_list,
                   help=f"seeds of the final re-runs ({default('seeds')})")
    p.add_argument("--name", type=_sweep_name, default=kind.name,
                   help="sweep name: its folder under --storage (letters, digits, . _ -)")
    p.add_argument("--storage", type=nonempty, default=env("VACSR_SWEEP_STORAGE") or "sweeps_out",
                   help="sweep folder; on a multi-node cluster a path every node mounts "
                        "(env VACSR_SWEEP_STORAGE)")
    p.add_argument("--ray-storage", type=nonempty, default=env("VACSR_RAY_STORAGE"),
                   help="Tune/Train experiments and checkpoints: a shared path or an s3:// gs:// "
                        "URI (env VACSR_RAY_STORAGE; default: the sweep folder)")
    p.add_argument("--optuna-storage", type=nonempty, default=env("VACSR_OPTUNA_STORAGE"),
                   help="Optuna RDB URL, e.g. postgresql://... (env VACSR_OPTUNA_STORAGE; "
                        "default: sqlite in the sweep folder)")
    p.add_argument("--tracking-uri", type=nonempty, default=env("MLFLOW_TRACKING_URI"),
                   help="MLflow URI (env MLFLOW_TRACKING_URI; default: sqlite in the sweep folder)")
    p.add_argument("--ray-address", type=nonempty, default=env("RAY_ADDRESS"),
                   help="Ray cluster to join (env RAY_ADDRESS, set by `ray job submit`; "
                        "default: start a local Ray of its own)")
    p.add_argument("--workers", type=_positive(int), default=1, help="Ray Train workers per trial")
    p.add_argument("--gpus-per-worker", type=float, default=0.0,
                   help="GPUs per Train worker (0.5 packs two trials on a GPU)")
    p.add_argument("--cpus-per-worker", type=_positive(float),
                   help=f"CPUs per Train worker ({default('cpus_per_worker')})")
    p.add_argument("--trial-cpus", type=_positive(float),
                   help="CPUs of a trial's actor where it only drives 2+ Train workers (a "
                        "one-worker trial trains in its actor, on --cpus-per-worker; "
                        f"{default('trial_cpus')})")
    p.add_argument("--eval-actors", type=_positive(int), default=1,
                   help="Ray actors scoring each final checkpoint's test splits (EvalPool)")
    p.add_argument("--parallel-datasets", type=_positive(int),
                   help="datasets searched at once (default: as many as the cluster holds)")
    p.add_argument("--concurrent-trials", type=_positive(int), default=1,
                   help="trials of one dataset run at once (default 1: the same table on every "
                        "run; more fills a cluster sooner, but ASHA's stops then depend on which "
                        "trial reports first)")
    p.add_argument("--range", action="append", default=[], metavar="KEY=KIND:LOW:HIGH",
                   help="override a search range, e.g. loss.beta=log:0.5:2")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every run")
    p.add_argument("--resume", action="store_true", help="continue a sweep whose driver died")
    p.add_argument("--seed", type=_seed, default=0, help="Optuna sampler seed")
    _add_plan_flags(p)
    p.add_argument("--verbose", action="store_true",
                   help="show Ray, Tune and Optuna output on the console (default: log files)")
    return p


def _add_plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", action="store_true",
                   help="print what the sweep would cost (counts, steps, device time, wall time, "
                        "peak memory per dataset, from a short calibration where trials run) "
                        "and exit; writes nothing but --plan-out and the measured costs, kept "
                        "for the next sweep on this machine")
    p.add_argument("--plan-out", type=nonempty, metavar="PATH",
                   help="with --plan: also write the plan as JSON to PATH")
    p.add_argument("--device-memory-gib", type=_positive(float),
                   help="memory of a worker's device: a configuration whose estimated peak "
                        "exceeds it is refused before any trial (default: the GPU's, measured "
                        "where trials run; none on CPUs)")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure the step costs again rather than reuse those kept in the sweep "
                        "folder or this machine's cache")


def load_profile(kind: SweepKind, path: Path = PROFILE) -> dict[str, Any]:
    """The embedded profile with the kind's section merged in (`set` merges, `range` replaces)."""
    profile = cfg.read_yaml_file(path, "the embedded sweep profile")
    section = (profile.pop("kinds", None) or {}).get(kind.name, {})
    profile["set"] = {**profile.get("set", {}), **section.get("set", {})}
    profile["range"] = section.get("range", profile.get("range", {}))
    return profile


def _datasets(kind: SweepKind, text: str | None) -> list[str]:
    names = [d.strip() for d in text.split(",") if d.strip()] if text else list(kind.datasets)
    for name in names:
        if name not in kind.datasets + kind.also_accepts:
            raise ConfigError(f"--datasets: unknown dataset {name!r} "
                              f"(known: {', '.join(kind.datasets)})")
    if not names:
        raise ConfigError("--datasets: expected at least one dataset name")
    return list(dict.fromkeys(names))


def _embedded_data(kind: SweepKind, profile: dict, storage: Path, model: str,
                   pretrained: str | None, datasets: list[str]) -> tuple[Path, str | None]:
    """No --data-root: synthetic data in the real layouts (and the pretrained tiny CLIP)."""
    from vacsr.data.generate import generate_all

    root = embedded_data(storage)
    if not (root / ".generated").is_file():
        print(f"writing synthetic datasets in their real layouts under {root}", flush=True)
        names = [d for d in kind.data_needed(datasets) if d not in kind.also_accepts]
        generate_all(root, datasets=names, per_class=tuple(profile["synthetic_per_class"]))
        (root / ".generated").write_text("ok\n")
    weights = embedded_weights(storage)
    if pretrained is None and profile.get("pretrain_tiny") and model == profile["model"]:
        from vacsr.model.pretrained_cache import install_pretrained

        # from the machine's cache (pretrained there once, by a digest of its recipe), with
        # its source and SHA-256 recorded beside it
        install_pretrained(weights)
        pretrained = str(weights)
    return root, pretrained


def _base_values(kind: SweepKind, args, profile: dict, root: Path, model: str,
                 pretrained: str | None) -> dict[str, Any]:
    """Config values every run of the sweep shares: plumbing, then the task's settings."""
    values = {"data.task": kind.task, "data.root": str(root), "model.name": model,
              "data.subsample_classes": kind.train_classes,
              "data.shots": _pick(args.shots, profile, "shots"),
              "train.progress": False, "train.resume": True, "train.workers": args.workers,
              "train.gpus_per_worker": args.gpus_per_worker,
              "train.cpus_per_worker": _pick(args.cpus_per_worker, profile, "cpus_per_worker"),
              # Ray Train restarts a run once after losing a worker; errors of the run itself
              # (bad data, a diverged loss) end it at once (vacsr/distributed/train.py)
              "train.max_failures": 1, **SWEEP_RUN_SETTINGS[kind.task]}
    if pretrained:
        values["model.pretrained"] = pretrained
    return values


def _pick(flag: Any, profile: dict, key: str) -> Any:
    return flag if flag is not None else profile.get(key, DEFAULTS[key])


def _ranges(kind: SweepKind, profile: dict, texts: list[str], fixed: dict[str, str],
            user: dict[str, Any]) -> tuple[dict[str, Domain], list[str]]:
    """The ranges searched beside the kind's space: the profile's, less the fixed keys, then the
    user's --range (refused on a fixed key); and the keys the sweep would search that the
    user's --set fixes instead (with their values, as the console names them)."""
    profile_ranges = {key: parse_range(f"{key}={text}")[1]
                      for key, text in profile.get("range", {}).items()}
    user_ranges = dict(parse_range(text) for text in texts)
    check_free_ranges(user_ranges, fixed)
    searched = {*kind.searched_keys, *profile_ranges}
    user_fixed = [f"{key}={cfg.shown(user[key])}" for key in user
                  if key in searched and key not in kind.protocol]
    ranges = {key: domain for key, domain in profile_ranges.items() if key not in fixed}
    return {**ranges, **user_ranges}, user_fixed


def _user_values(args) -> dict[str, Any]:
    """The values the user fixes: each --set, and --epochs N as --set train.epochs=N (the
    same rule: never searched); both on train.epochs with two values is one line."""
    user = dict(cfg.parse_override(text) for text in args.set)
    if args.epochs:
        if user.setdefault("train.epochs", args.epochs) != args.epochs:
            raise ConfigError(f"--epochs {args.epochs}: --set train.epochs="
                              f"{cfg.shown(user['train.epochs'])} gives another value; give one")
    return user


def _writes_to_check(uri: str) -> bool:
    """A store checked by creating it (SQLite, a file store): --plan leaves it unchecked."""
    return uri.startswith(("sqlite", "file")) or "://" not in uri


def _check_plan(plan: SweepPlan, args, check_memory: Callable[[SweepPlan], Any]) -> None:
    """The memory, then the stores, each one line before any trial; --plan skips the checks that
    create a store."""
    check_memory(plan)  # a configuration that cannot fit: one line, nothing written
    if not (args.plan and _writes_to_check(plan.tracking_uri)):
        check_tracking_uri(plan.tracking_uri)  # unreachable or refused
    if plan.optuna_url and not (args.plan and _writes_to_check(plan.optuna_url)):
        check_optuna_storage(plan)  # an unreachable study database fails here, not in a trial


def plan_from_args(kind: SweepKind, args, *, check_memory: Callable[[SweepPlan], Any],
                   on_folder: Callable[[Path], Any] | None = None) -> SweepPlan:
    """Parse and check everything (names, ranges, configs, memory, MLflow, Optuna) into a
    SweepPlan; only then call `on_folder(sweep folder)` (the driver takes its lock there) and
    write the embedded profile's synthetic data. `check_memory(plan)`: the device-memory check
    of a layer above (vacsr/sweep/cost/memory.py's refuse_unfit)."""
    datasets = _datasets(kind, args.datasets)
    embedded = args.data_root is None
    profile = load_profile(kind) if embedded else {}
    model = _pick(args.model, profile, "model")
    check_model(model)
    if args.pretrained:
        check_pretrained(args.pretrained, model)
    if args.ray_address:  # a cluster that is not there: one line now, not a wait in ray.init
        check_ray_address(args.ray_address)
    methods = parse_methods(args.methods, kind)
    user = _user_values(args)  # each --set parsed here, once
    fixed = fixed_by(kind.protocol, user, kind.name)  # never searched (space.py)
    ranges, user_fixed = _ranges(kind, profile, args.range, fixed, user)
    check_method_keys(methods, user, dict(parse_range(text) for text in args.range))
    storage = sweep_folder(args.storage, args.name)
    root = embedded_data(storage) if embedded else Path(args.data_root).expanduser().resolve()
    train_counts = {} if embedded else check_datasets(
        root, kind.task, [d for d in kind.data_needed(datasets) if d not in kind.also_accepts])
    tiny = embedded and profile.get("pretrain_tiny") and model == profile["model"]
    pretrained = args.pretrained or (str(embedded_weights(storage)) if tiny else None)
    shared = _base_values(kind, args, profile, root, model, pretrained)
    configs, spaces = unit_configs(kind, datasets, methods, [shared, dict(kind.protocol),
                                                             profile.get("set", {}), user],
                                   set(user), storage, ranges, fixed, tower_depths(model))
    note_fewer_shots(train_counts, configs)
    # a local instance of the sweep's own (the GPUs torch sees); one the caller started has its own
    ray = sys.modules.get("ray")  # not imported: not started either
    started = ray is not None and ray.is_initialized()
    check_devices(configs, local=not args.ray_address and not started,
                  trial_cpus=_pick(args.trial_cpus, profile, "trial_cpus"))
    tracking_uri = resolve_tracking_uri(args.tracking_uri, default_dir=storage)
    plan = SweepPlan(
        kind=kind, name=args.name, configs=configs, spaces=spaces, storage=storage,
        tracking_uri=tracking_uri,
        trials=_pick(args.trials, profile, "trials"),
        seeds=args.seeds or tuple(_pick(None, profile, "seeds")), sampler_seed=args.seed,
        resume=args.resume, parallel=args.parallel_datasets,
        concurrent_trials=args.concurrent_trials,
        trial_cpus=_pick(args.trial_cpus, profile, "trial_cpus"),
        ray_storage=check_ray_storage(args.ray_storage), optuna_url=args.optuna_storage or "",
        ray_address=args.ray_address, eval_actors=args.eval_actors, verbose=args.verbose,
        device_memory_gib=args.device_memory_gib,
        synthetic_per_class=tuple(profile["synthetic_per_class"]) if embedded else None,
        recalibrate=args.recalibrate, methods=methods)
    _check_plan(plan, args, check_memory)
    if user_fixed:  # once per sweep, not per dataset
        print(f"--set fixes searched keys: {', '.join(user_fixed)}; every trial and final run "
              "of every dataset has their values", flush=True)
    for line in ignored_settings(methods, user):
        print(line, flush=True)
    if args.plan:  # the sweep folder is neither locked nor written
        return plan
    if on_folder is not None:
        on_folder(storage)
    if embedded:
        _embedded_data(kind, profile, storage, model, args.pretrained, datasets)
    return plan
