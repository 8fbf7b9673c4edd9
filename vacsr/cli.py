"""The `vacsr` command: train, pretrain-tiny, demo.

Every user error (bad config, missing file, bad data) ends with one line `vacsr: error: ...` on
stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vacsr.errors import VacsrError


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML file of overrides (sections: model, adapter, loss, "
                                         "optim, data, train)")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied last")


def cmd_train(args) -> int:
    from vacsr.config import load_config
    from vacsr.train.loop import train

    overrides = list(args.overrides)
    if args.ray:
        overrides.append("train.ray=true")
    if args.workers:
        overrides.append(f"train.workers={args.workers}")
    config = load_config(args.config, overrides)
    if config.train.ray:
        from vacsr.distributed.train import fit_ray

        result = fit_ray(config)
    else:
        result = train(config)
    print(format_metrics(result.final_metrics))
    print(f"checkpoint: {result.checkpoint}")
    return 0


def cmd_eval(args) -> int:
    from vacsr.config import from_dict, load_config
    from vacsr.train.checkpoint import load_checkpoint
    from vacsr.train.evaluate import evaluate_checkpoint
    from vacsr.train.loop import write_json

    checkpoint = Path(args.checkpoint).expanduser().resolve()
    config = load_config(args.config, args.overrides,
                         base=from_dict(load_checkpoint(checkpoint)["config"]))
    out = Path(args.out) if args.out else checkpoint.with_name(
        f"eval-{config.data.dataset}-{config.data.subsample_classes}-{args.split}.json")
    extra = {}
    if config.data.task == "retrieval":
        extra["uncertainty_plot"] = out.with_suffix(".uncertainty.png")
        if args.two_stage:
            extra["two_stage_k"] = args.two_stage
    # a retrieval test split also gets the COCO 1K recalls (5 folds; evaluate_checkpoint)
    metrics = evaluate_checkpoint(config, checkpoint, split=args.split, **extra)
    print(format_metrics(metrics))
    write_json(out, {"checkpoint": str(checkpoint), "dataset": config.data.dataset,
                     "split": args.split, "metrics": metrics})
    print(f"wrote {out}" + (f" and {extra['uncertainty_plot']}" if "uncertainty_plot" in extra
                            else ""))
    return 0


def cmd_pretrain_tiny(args) -> int:
    from vacsr.model.pretrain import pretrain_clip

    path = pretrain_clip(args.out, epochs=args.epochs, num_images=args.num_images, seed=args.seed)
    print(f"wrote {path}")
    return 0


def cmd_generate_data(args) -> int:
    from vacsr.data.generate import generate_all

    names = args.datasets.split(",") if args.datasets else None
    generate_all(Path(args.root), seed=args.seed, datasets=names)
    print(f"wrote synthetic datasets in their real layouts under {Path(args.root).resolve()}")
    return 0


def cmd_best(args) -> int:
    from vacsr.sweep.best import best_configs, format_rows

    rows = best_configs(args.tracking_uri, args.experiment, args.sweep,
                        Path(args.export) if args.export else None)
    print(format_rows(rows))
    if args.export:
        print(f"best configs written to {Path(args.export).resolve()} "
              "(each runs with `vacsr train --config FILE`)")
    return 0


def cmd_demo(args) -> int:
    from vacsr.demo import run_demo

    run_demo(Path(args.workdir), epochs=args.epochs)
    return 0


def format_metrics(metrics: dict) -> str:
    """A two-column table of the numeric metrics, one per line."""
    rows = [(k, v) for k, v in metrics.items() if isinstance(v, (int, float))]
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k:<{width}}  {v:10.4f}" if isinstance(v, float) else f"{k:<{width}}  {v:>10}"
                     for k, v in rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vacsr", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train VACSR locally, or on Ray Train workers (--ray)")
    _add_config_args(train)
    train.add_argument("--ray", action="store_true", help="run through Ray Train (TorchTrainer)")
    train.add_argument("--workers", type=int, help="Ray Train workers (implies nothing without "
                                                   "--ray or train.ray=true)")
    train.set_defaults(func=cmd_train)

    ev = sub.add_parser("eval", help="evaluate a checkpoint on a dataset split")
    ev.add_argument("--checkpoint", required=True, help="a vacsr checkpoint (last.ckpt)")
    _add_config_args(ev)
    ev.add_argument("--split", default="test", help="test (default), val or train")
    ev.add_argument("--out", help="metrics JSON (default: beside the checkpoint)")
    ev.add_argument("--two-stage", type=int, metavar="K", help="retrieval: cosine top-K re-ranked")
    ev.set_defaults(func=cmd_eval)

    pre = sub.add_parser("pretrain-tiny", help="pretrain the tiny CLIP on synthetic data")
    pre.add_argument("--out", required=True, help="weights file to write")
    pre.add_argument("--epochs", type=int, default=6)
    pre.add_argument("--num-images", type=int, default=1024)
    pre.add_argument("--seed", type=int, default=0)
    pre.set_defaults(func=cmd_pretrain_tiny)

    gen = sub.add_parser("generate-data", help="write synthetic datasets in the real layouts")
    gen.add_argument("--root", required=True, help="folder to write (one sub-folder a dataset)")
    gen.add_argument("--datasets", help="comma-separated names (default: all)")
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(func=cmd_generate_data)

    best = sub.add_parser("best", help="best config and metrics per dataset of a sweep (MLflow)")
    best.add_argument("--experiment", default="vacsr-base2novel",
                      help="vacsr-base2novel, vacsr-retrieval or vacsr-domain_generalization")
    best.add_argument("--sweep", help="sweep name (default: the newest sweep)")
    best.add_argument("--tracking-uri", help="MLflow URI (default: $MLFLOW_TRACKING_URI)")
    best.add_argument("--export", help="folder to write <dataset>.yaml best configs into")
    best.set_defaults(func=cmd_best)

    demo = sub.add_parser("demo", help="end-to-end run on synthetic data with the tiny model")
    demo.add_argument("--workdir", default="demo_data", help="where data, weights and runs go")
    demo.add_argument("--epochs", type=int, default=3)
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except VacsrError as exc:
        print(f"vacsr: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
