"""A sweep script's flags to a checked SweepPlan: every check runs before any trial starts. The
flags themselves are flags.py's, the embedded profile embedded_profile.py's.

Each flag's text is parsed exactly once here (--set values by `vacsr.config.parse_override`,
--range by `parse_range`); from then on configs travel as objects.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from vacsr import config as cfg
from vacsr.errors import ConfigError
from vacsr.records.uri import check_tracking_uri, resolve_tracking_uri
from vacsr.sweep.plan.embedded_profile import (
    load_profile,
    pick,
    synthetic_sizes,
    synthetic_train_counts,
    write_embedded_data,
)
from vacsr.sweep.plan.folders import (
    embedded_data,
    embedded_weights,
    sweep_folder,
)
from vacsr.sweep.plan.inputs import (
    check_datasets,
    check_devices,
    check_model,
    check_one_batch,
    check_pretrained,
    check_ray_address,
    check_ray_storage,
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
from vacsr.sweep.spec.kind import SweepKind
from vacsr.sweep.spec.space import (
    Domain,
    check_free_ranges,
    fixed_by,
    parse_range,
    tower_depths,
)
from vacsr.task_names import SWEEP_RUN_SETTINGS


def _datasets(kind: SweepKind, text: str | None) -> list[str]:
    names = [d.strip() for d in text.split(",") if d.strip()] if text else list(kind.datasets)
    for name in names:
        if name not in kind.datasets + kind.also_accepts:
            raise ConfigError(f"--datasets: unknown dataset {name!r} "
                              f"(known: {', '.join(kind.datasets)})")
    if not names:
        raise ConfigError("--datasets: expected at least one dataset name")
    return list(dict.fromkeys(names))


def _base_values(kind: SweepKind, args, profile: dict, root: Path, model: str,
                 pretrained: str | None) -> dict[str, Any]:
    """Config values every run of the sweep shares: plumbing, then the task's settings."""
    values = {"data.task": kind.task, "data.root": str(root), "model.name": model,
              "data.subsample_classes": kind.train_classes,
              "data.shots": pick(args.shots, profile, "shots"),
              "train.progress": False, "train.resume": True, "train.workers": args.workers,
              "train.gpus_per_worker": args.gpus_per_worker,
              "train.cpus_per_worker": pick(args.cpus_per_worker, profile, "cpus_per_worker"),
              # Ray Train restarts a run once after losing a worker; errors of the run itself
              # (bad data, a diverged loss) end it at once (vacsr/distributed/train.py)
              "train.max_failures": 1, **SWEEP_RUN_SETTINGS[kind.task]}
    if pretrained:
        values["model.pretrained"] = pretrained
    return values


def _ranges(kind: SweepKind, profile: dict, user_ranges: dict[str, Domain],
            fixed: dict[str, str], user: dict[str, Any]) -> tuple[dict[str, Domain], list[str]]:
    """The ranges searched beside the kind's space: the profile's, less the fixed keys, then the
    user's --range (refused on a fixed key); and the keys the sweep would search that the
    user's --set fixes instead (with their values, as the console names them)."""
    profile_ranges = {key: parse_range(f"{key}={text}")[1]
                      for key, text in profile.get("range", {}).items()}
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


def _check_plan(plan: SweepPlan, args, check_memory: Callable[[SweepPlan], Any],
                train_counts: dict[str, dict[int, int]]) -> None:
    """The memory and the batches, then the stores, each one line before any trial; --plan
    skips the checks that create a store."""
    check_memory(plan)  # a configuration that cannot fit: one line, nothing written
    check_one_batch(train_counts, plan.configs, plan.spaces)  # nor one that cannot train
    if not (args.plan and _writes_to_check(plan.tracking_uri)):
        check_tracking_uri(plan.tracking_uri)  # unreachable or refused
    if plan.optuna_url and not (args.plan and _writes_to_check(plan.optuna_url)):
        check_optuna_storage(plan)  # an unreachable study database fails here, not in a trial


def _check_flag_pairs(args) -> None:
    """Flags that mean nothing together, refused in one line."""
    if args.rehearse and args.workers > 1:  # a rehearsed run holds one worker's resources
        raise ConfigError(f"--rehearse with --workers {args.workers}: a rehearsal rehearses runs "
                          "of one worker; expected --workers 1")
    if args.rehearse and args.eval_actors > 1:  # its test evaluation holds one actor's
        raise ConfigError(f"--rehearse with --eval-actors {args.eval_actors}: a rehearsal "
                          "rehearses one evaluation actor; expected --eval-actors 1")
    if args.free_running and args.draw_slack:  # free-running draws from whatever was told
        raise ConfigError(f"--draw-slack {args.draw_slack} with --free-running: the slack "
                          "paces the deterministic search's draws; free-running draws wait "
                          "for nothing (drop one of the two)")


def plan_from_args(kind: SweepKind, args, *, check_memory: Callable[[SweepPlan], Any],
                   on_folder: Callable[[Path], Any] | None = None) -> SweepPlan:
    """Parse and check everything (names, ranges, configs, memory, MLflow, Optuna) into a
    SweepPlan; only then call `on_folder(sweep folder)` (the driver takes its lock there) and
    write the embedded profile's synthetic data. `check_memory(plan)`: the device-memory check
    of a layer above (vacsr/sweep/cost/memory.py's refuse_unfit)."""
    datasets = _datasets(kind, args.datasets)
    _check_flag_pairs(args)
    embedded = args.data_root is None
    profile = load_profile(kind) if embedded else {}
    model = pick(args.model, profile, "model")
    check_model(model)
    if args.pretrained:
        check_pretrained(args.pretrained, model)
    if args.ray_address:  # a cluster that is not there: one line now, not a wait in ray.init
        if args.ray_dashboard:  # a cluster's dashboard is its head's, started with it
            raise ConfigError(f"--ray-dashboard with --ray-address {args.ray_address}: the "
                              "dashboard is the local instance's; a cluster's is its head's "
                              "(ray start --include-dashboard)")
        check_ray_address(args.ray_address)
    methods = parse_methods(args.methods, kind)
    user = _user_values(args)  # each --set parsed here, once
    fixed = fixed_by(kind.protocol, user, kind.name)  # never searched (space.py)
    user_ranges = dict(parse_range(text) for text in args.range)  # each --range, once
    ranges, user_fixed = _ranges(kind, profile, user_ranges, fixed, user)
    check_method_keys(methods, user, user_ranges)
    storage = sweep_folder(args.storage, args.name)
    root = embedded_data(storage) if embedded else Path(args.data_root).expanduser().resolve()
    train_counts = synthetic_train_counts(kind, synthetic_sizes(profile), datasets) if embedded \
        else check_datasets(root, kind.task,
                            [d for d in kind.data_needed(datasets) if d not in kind.also_accepts])
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
                  trial_cpus=pick(args.trial_cpus, profile, "trial_cpus"))
    tracking_uri = resolve_tracking_uri(args.tracking_uri, default_dir=storage)
    plan = SweepPlan(
        kind=kind, name=args.name, configs=configs, spaces=spaces, storage=storage,
        tracking_uri=tracking_uri,
        trials=pick(args.trials, profile, "trials"),
        seeds=args.seeds or tuple(pick(None, profile, "seeds")), sampler_seed=args.seed,
        startup_trials=args.startup_trials, draw_slack=args.draw_slack,
        resume=args.resume, parallel=args.parallel_datasets,
        concurrent_trials=args.concurrent_trials, free_running=args.free_running,
        trial_cpus=pick(args.trial_cpus, profile, "trial_cpus"),
        ray_storage=check_ray_storage(args.ray_storage), optuna_url=args.optuna_storage or "",
        ray_address=args.ray_address, ray_dashboard=args.ray_dashboard,
        eval_actors=args.eval_actors, verbose=args.verbose,
        device_memory_gib=args.device_memory_gib,
        synthetic=synthetic_sizes(profile) if embedded else None,
        recalibrate=args.recalibrate, methods=methods, rehearse=args.rehearse)
    _check_plan(plan, args, check_memory, train_counts)
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
        write_embedded_data(kind, profile, storage, model, args.pretrained, datasets)
    return plan
