"""A sweep script's flags: the parser, each flag's help with its defaults (the paper's and the
embedded profile's), and a bad flag's one-line refusal. What the flags mean together is
command_line.py's."""
from __future__ import annotations

import argparse
import math
import os
from typing import Any

from vacsr import config as cfg
from vacsr.help_format import DefaultsHelp, flag_error, nonempty
from vacsr.methods.registry import METHODS
from vacsr.sweep.plan.embedded_profile import DEFAULTS, PROFILE, load_profile
from vacsr.sweep.plan.inputs import check_sweep_name
from vacsr.sweep.plan.plan import DRAW_SLACK, STARTUP_TRIALS
from vacsr.sweep.spec.kind import SweepKind, sweep_script


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


def _integer(text: str, low: int, high: int | None = None, what: str = "an integer") -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"from {low} to {high}"
        raise argparse.ArgumentTypeError(f"expected {what} {bounds}, got {text}")
    return value


def _count(text: str) -> int:
    return _integer(text, 0)


def _seed(text: str) -> int:
    return _integer(text, 0, cfg.MAX_SEED, "a seed")


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
    p.add_argument("--ray-dashboard", action="store_true",
                   help="start the local Ray with its dashboard on 127.0.0.1 (default: without "
                        "it; the console and MLflow show the sweep, and the dashboard's "
                        "processes take seconds of CPU a minute)")
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
    p.add_argument("--concurrent-trials", type=_positive(int),
                   help="trials of one dataset run at once (default: the cluster's trial slots "
                        "divided among the datasets searched at once, fixed at the sweep's "
                        "start); the table depends on it, not on timing")
    p.add_argument("--startup-trials", type=_positive(int), default=STARTUP_TRIALS,
                   help="a dataset's trials told to Optuna before its TPE sampler models them; "
                        "the draws before are random (Optuna's n_startup_trials)")
    p.add_argument("--draw-slack", type=_count, default=DRAW_SLACK,
                   help="with N trials of a dataset at once, trial k's config is drawn from "
                        "trials 0..k-N-S: each unit lets a trial start while one more earlier "
                        "trial runs (fewer idle slots), and each draw reads one trial fewer")
    p.add_argument("--free-running", action="store_true",
                   help="draw and stop a dataset's trials as their results arrive (Optuna and "
                        "asynchronous ASHA with no waits): busier GPUs, but with 2+ trials at "
                        "once the table then depends on timing")
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
    p.add_argument("--rehearse", type=_positive(float), metavar="SCALE",
                   help="rehearse the sweep: everything runs for real (Ray, Tune, Optuna, ASHA, "
                        "MLflow, checkpoints, final seeds, reports, --resume) but training, "
                        "which waits the cost model's seconds divided by SCALE and reports a "
                        "synthetic curve; its records are marked and never results")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure the step costs again rather than reuse those kept in the sweep "
                        "folder or this machine's cache")
