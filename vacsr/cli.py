"""The `vacsr` command: train, eval, pretrain-tiny, generate-data, best, demo.

Every user error (bad flag, bad config, missing file, bad data) ends with one line
`vacsr: error: ...` on stderr and exit status 2. A flag that is not given is None; an empty or zero
value is an error wherever it would otherwise quietly mean "the default".
"""
from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from vacsr.errors import UsageError, VacsrError
from vacsr.help_format import DefaultsHelp, flag_error, nonempty
from vacsr.results import format_metrics
from vacsr.train.run_files import CHECKPOINT_FILE


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line like every other vacsr error (usage stays in --help)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelp)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(flag_error(self.prog, message))


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (0 would otherwise read as 'not given')."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _names(text: str) -> list[str]:
    """argparse type: comma-separated names, none of them empty."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def _per_class(text: str) -> tuple[int, int, int]:
    """argparse type: TRAIN,VAL,TEST images per class, each an integer >= 1."""
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected TRAIN,VAL,TEST (three integers), got {text!r}")
    counts = tuple(_positive_int(part) for part in parts)
    return counts[0], counts[1], counts[2]


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=nonempty,
                        help="YAML file of overrides (sections: model, adapter, loss, optim, "
                             "data, train)")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied last")


def _method_values(filled: dict, config, given: frozenset[str]) -> None:
    """load_config's fill for `vacsr train`: the values the config's method fixes where the user
    gave none (as a sweep gives them to its units), noted in `filled`."""
    from vacsr.methods.registry import method_of

    filled.update(method_of(config.adapter.kind).fill_fixed(config, given))


def cmd_train(args) -> int:
    from vacsr.config import flatten, load_config, shown
    from vacsr.methods.registry import method_of
    from vacsr.stop import stop_on_signals
    from vacsr.train.run_folder import check_run_output, claim_run_folder
    from vacsr.train.scratch import clear_scratch

    overrides = list(args.overrides)
    if args.ray:
        overrides.append("train.ray=true")
    if args.workers is not None:
        overrides.append(f"train.workers={args.workers}")
    filled: dict = {}
    config = load_config(args.config, overrides, fill=partial(_method_values, filled))
    method = method_of(config.adapter.kind)
    method.check_task(config.data.task)  # before the run folder exists, as the trainer would
    method.check_config(flatten(config))  # a value given against what the method fixes
    if filled:  # once, on stdout: stderr holds a refusal's one line alone
        print(f"adapter.kind={method.name} fixes "
              f"{' '.join(f'{k}={shown(v)}' for k, v in filled.items())} ({method.trains}); "
              "a value given for one of them must be that one", flush=True)
    check_run_output(config)  # a file, /dev/null or a read-only place: before any work
    open_logger = None  # the MLflow run of a local run: opened by its trainer once restored
    if config.tracking.enabled:  # a wrong store, before the run folder is created
        from vacsr.records.logger import mlflow_logger
        from vacsr.records.uri import check_tracking_uri

        check_tracking_uri(config.tracking.uri)
        open_logger = mlflow_logger(config)
    # held for the whole run (its Ray workers write it for this process); a finished or stopped
    # run continues only with its own settings
    with claim_run_folder(config) as folder:
        clear_scratch(folder)  # a killed run's temporary copies (held: nothing trains there)
        if config.train.ray:
            from vacsr.distributed.train import fit_ray

            result = fit_ray(config)  # its workers own the MLflow run
        else:
            from vacsr.train.loop import train  # torch: after the checks, which need none

            with stop_on_signals():  # SIGTERM / Ctrl-C: the MLflow run closes as KILLED
                result = train(config, open_logger=open_logger)
    print(format_metrics(result.final_metrics))
    print(f"checkpoint: {result.checkpoint}")
    return 0


def cmd_eval(args) -> int:
    from vacsr.config import from_dict, load_config
    from vacsr.folder_lock import check_output_file
    from vacsr.model.weights import random_init_expected
    from vacsr.tasks import task_type
    from vacsr.train.checkpoint import load_checkpoint
    from vacsr.train.eval_pass import evaluate_checkpoint
    from vacsr.train.loop import write_json

    checkpoint = Path(args.checkpoint).expanduser().resolve()
    stored = load_checkpoint(checkpoint).get("config")  # absent: defaults, checked on loading
    config = load_config(args.config, args.overrides,
                         base=from_dict(stored) if isinstance(stored, dict) else None)
    out = Path(args.out) if args.out is not None else checkpoint.with_name(
        f"eval-{config.data.dataset}-{config.data.subsample_classes}-{args.split}.json")
    check_output_file(out, "the metrics (--out)")  # before the evaluation, not after it
    extra = {}
    if task_type(config.data.task).ranks_items:
        extra["uncertainty_plot"] = out.with_suffix(".uncertainty.png")
        if args.two_stage is not None:
            extra["two_stage_k"] = args.two_stage
    # the backbone is built without weights and gets the checkpoint's: open_clip's notice that
    # it is randomly initialised would be false (and a second line beside an error)
    with random_init_expected():
        # a retrieval test split also gets the COCO 1K recalls (5 folds; evaluate_checkpoint)
        if args.actors is None:
            metrics = evaluate_checkpoint(config, checkpoint, split=args.split, **extra)
        else:
            metrics = _evaluate_on_actors(config, checkpoint, args.split, args.actors, extra)
    print(format_metrics(metrics))
    write_json(out, {"checkpoint": str(checkpoint), "dataset": config.data.dataset,
                     "split": args.split, "metrics": metrics})
    # the Fig. 3 plot exists where the head has a sigma_hat (its analysis' metrics say so)
    plotted = "uncertainty_plot" in extra and any(k.startswith("uncertainty_") for k in metrics)
    print(f"wrote {out}" + (f" and {extra['uncertainty_plot']}" if plotted else ""))
    return 0


def _evaluate_on_actors(config, checkpoint: Path, split: str, actors: int, extra: dict) -> dict:
    """Encode here, score on `actors` Ray evaluation actors (queries sharded, exact merge)."""
    from vacsr.distributed.cluster import ensure_ray, quiet_logging
    from vacsr.distributed.pool_scorer import PoolScorer
    from vacsr.train.eval_pass import encode_checkpoint

    quiet_logging()
    ensure_ray(log_to_driver=False)
    scorer = PoolScorer(actors)
    try:
        return scorer(encode_checkpoint(config, checkpoint, split=split), **extra)
    finally:
        scorer.shutdown()


def cmd_pretrain_tiny(args) -> int:
    from vacsr.model.pretrain import pretrain_clip

    path = pretrain_clip(args.out, epochs=args.epochs, num_images=args.num_images, seed=args.seed)
    print(f"wrote {path}")
    return 0


def cmd_generate_data(args) -> int:
    from vacsr.data.generate import generate_all

    generate_all(Path(args.root), seed=args.seed, datasets=args.datasets,
                 per_class=args.per_class, imagenet_classes=args.imagenet_classes)
    print(f"wrote synthetic datasets in their real layouts under {Path(args.root).resolve()}")
    return 0


def cmd_best(args) -> int:
    """Exit status 0 on an unfinished sweep too: what its store holds is what was asked for, and
    the output's first lines say that it is unfinished and how it continues."""
    from vacsr.sweep.report.best import (
        best_configs,
        format_rows,
        sweep_importance,
        sweep_notice,
        sweep_table,
    )

    export = Path(args.export) if args.export is not None else None
    if args.compare:  # its notice comes with it: its best methods depend on it
        from vacsr.sweep.report.stored_comparison import sweep_comparison

        print(sweep_comparison(args.tracking_uri, args.experiment, args.sweep, export), end="")
        if export is not None:
            print(f"each method's configs written to {export.resolve()} as "
                  "<dataset>.<method>.yaml (each runs with `vacsr train --config FILE`)")
        return 0
    if args.importance:
        text = sweep_importance(args.tracking_uri, args.experiment, args.sweep)
    elif args.table:
        text = sweep_table(args.tracking_uri, args.experiment, args.sweep)
    else:
        text = format_rows(best_configs(args.tracking_uri, args.experiment, args.sweep,
                                        export)) + "\n"
    # read after the output it heads, so a refusal of that output prints nothing else
    print(sweep_notice(args.tracking_uri, args.experiment, args.sweep) + text, end="")
    if export is not None and not (args.importance or args.table):
        print(f"best configs written to {export.resolve()} "
              "(each runs with `vacsr train --config FILE`)")
    return 0


def cmd_demo(args) -> int:
    from vacsr.demo import run_demo

    run_demo(Path(args.workdir), epochs=args.epochs)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from vacsr import __version__

    parser = _Parser(prog="vacsr", description="VACSR (arXiv 2605.30968): train, evaluate and "
                     "read sweeps of a variational adapter on CLIP. The sweeps themselves run "
                     "from sweeps/*.py.")
    parser.add_argument("--version", action="version", version=f"vacsr {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="train VACSR locally, or on Ray Train workers (--ray)")
    _add_config_args(train)
    train.add_argument("--ray", action="store_true", help="run through Ray Train (TorchTrainer)")
    train.add_argument("--workers", type=_positive_int,
                       help="Ray Train workers (implies nothing without --ray or train.ray=true)")
    train.set_defaults(func=cmd_train)

    ev = sub.add_parser("eval", help="evaluate a checkpoint on a dataset split")
    ev.add_argument("--checkpoint", required=True, type=nonempty,
                    help=f"a vacsr checkpoint ({CHECKPOINT_FILE})")
    _add_config_args(ev)
    ev.add_argument("--split", default="test", choices=("test", "val", "train"),
                    help="test (default), val or train")
    ev.add_argument("--out", type=nonempty, help="metrics JSON (default: beside the checkpoint)")
    ev.add_argument("--two-stage", type=_positive_int, metavar="K",
                    help="retrieval: cosine top-K re-ranked")
    ev.add_argument("--actors", type=_positive_int, metavar="N",
                    help="score on N Ray evaluation actors (default: in this process)")
    ev.set_defaults(func=cmd_eval)

    pre = sub.add_parser("pretrain-tiny", help="pretrain the tiny CLIP on synthetic data")
    pre.add_argument("--out", required=True, type=nonempty, help="weights file to write")
    pre.add_argument("--epochs", type=_positive_int, default=6,
                     help="contrastive pretraining epochs")
    pre.add_argument("--num-images", type=_positive_int, default=1024,
                     help="synthetic images (5 captions each; at least one batch of 128 pairs)")
    pre.add_argument("--seed", type=int, default=0, help="seed of the data and the weights")
    pre.set_defaults(func=cmd_pretrain_tiny)

    gen = sub.add_parser("generate-data", help="write synthetic datasets in the real layouts")
    gen.add_argument("--root", required=True, type=nonempty,
                     help="folder to write (one sub-folder a dataset)")
    gen.add_argument("--datasets", type=_names, help="comma-separated names (default: all)")
    gen.add_argument("--seed", type=int, default=0, help="seed of the synthetic images")
    gen.add_argument("--per-class", type=_per_class, default=(4, 3, 2), metavar="TRAIN,VAL,TEST",
                     help="images per class of the classification datasets (20,4,2: the 16-shot "
                          "protocol's train and val sizes, ImageNet's val drawn from train)")
    gen.add_argument("--imagenet-classes", type=_positive_int, default=1000, metavar="N",
                     help="ImageNet's first N classes of 1,000 (its variants their shares)")
    gen.set_defaults(func=cmd_generate_data)

    best = sub.add_parser("best", help="best config and metrics per dataset of a sweep (MLflow)")
    best.add_argument("--experiment", default="vacsr-base2novel", type=nonempty,
                      help="vacsr-base2novel, vacsr-retrieval or vacsr-domain_generalization")
    best.add_argument("--sweep", type=nonempty, help="sweep name (default: the newest sweep)")
    best.add_argument("--tracking-uri", type=nonempty,
                      help="the sweep's MLflow store (default: $MLFLOW_TRACKING_URI, else "
                           "./mlflow.db); read only, never created")
    best.add_argument("--export", type=nonempty,
                      help="folder to write <dataset>.yaml best configs into (a sweep of "
                           "several methods: <dataset>.<method>.yaml)")
    shown = best.add_mutually_exclusive_group()
    shown.add_argument("--table", action="store_true",
                       help="print the sweep's table (mean ± std over seeds) from MLflow alone")
    shown.add_argument("--importance", action="store_true",
                       help="print each dataset's importance of the searched keys (MLflow alone)")
    shown.add_argument("--compare", action="store_true",
                       help="print the method comparison of a sweep run with --methods "
                            "(report/comparison.md) from MLflow alone")
    best.set_defaults(func=cmd_best)

    demo = sub.add_parser("demo", help="end-to-end run on synthetic data with the tiny model")
    demo.add_argument("--workdir", default="demo_data", type=nonempty,
                      help="where data, weights and runs go")
    demo.add_argument("--epochs", type=_positive_int, default=3,
                      help="epochs of the demo's training run")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except VacsrError as exc:
        print(f"vacsr: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # vacsr.stop.Stopped for SIGTERM, or a bare Ctrl-C
        code = getattr(exc, "exit_code", 130)
        print(f"vacsr: {exc or 'stopped by SIGINT'}; an MLflow run it had open is closed as "
              "KILLED; the same command continues from the last checkpoint", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
