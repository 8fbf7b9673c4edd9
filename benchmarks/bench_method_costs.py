"""What the compared few-shot methods' training costs against a VACSR trial's, at real shapes.

    .venv/bin/python benchmarks/bench_method_costs.py            # 10 classes x 8 shots, 2 epochs
    .venv/bin/python benchmarks/bench_method_costs.py --quick    # 5 classes x 4 shots, 1 epoch

ViT-B/16 with random weights (nothing is downloaded) on synthetic EuroSAT in its real layout,
images rendered at 224 px. The methods whose image tower is frozen (linear probe, CLIP-Adapter,
CoOp, CoCoOp: vacsr/methods/method.py FROZEN_CLIP) train on each training image's feature computed
once (vacsr/train/loop.py Trainer.feature_dataset, through the dataset's prefix cache as a sweep's
trials share it): that pass is timed on its own, cold (computed and stored) for the first method,
warm (read back) for the others. Then the training itself of each trial, Trainer.train_epoch over
every epoch (no model building, no evaluation, no Ray), against a VACSR trial training one block
per tower, the last one (model.trainable_side=last, the cheaper side: docs/performance.md, "Which
end of a tower trains"). Every trial sees the same images, the same shuffled batches (one seed) and
the same number of steps; data.augment is off for all (the frozen methods fix it off).

CPU-seconds are this process's (time.process_time) with --threads intra-op threads, so other work
on a shared machine slows the wall time more than them. The target: each compared method's
training <= 0.1x VACSR's, printed with PASS or FAIL (the prompt and deep methods reported, not
part of the target).

Then what `--plan` would say of each trial: the step costs calibrated here as a sweep's first
unit calibrates them (vacsr/sweep/cost/calibrate.py measure_costs, on VACSR's configuration), and
each method's trial composed from them (vacsr/sweep/cost/estimate.py: what the method runs,
its training features once per run, the prompts through the text tower), against the trial
measured above: its cold feature pass and its training. Target: within +-35% for every method,
printed with PASS or FAIL.
"""
from __future__ import annotations

import argparse
import gc
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vacsr.config import load_config  # noqa: E402
from vacsr.methods.registry import METHODS  # noqa: E402
from vacsr.threads import torch_threads  # noqa: E402
from vacsr.train.loop import Trainer  # noqa: E402

TARGET = 0.1  # each compared method's training CPU-s / VACSR's
PLAN_TOLERANCE = 0.35  # --plan's trial estimate / the measured trial, within 1 +- this
COMPARED = ("linear_probe", "clip_adapter")  # held to TARGET
ORDER = ("linear_probe", "clip_adapter", "coop", "cocoop", "mma", "maple", "vacsr")
# what one training step computes, for the printout (block counts: ViT-B/16, 12 per tower)
PER_STEP = {
    "linear_probe": "B cached features x C prototypes, backward into the C x d prototypes (the C "
                    "prompts through the frozen text tower once per trial, at its first step)",
    "clip_adapter": "the bottleneck MLP on B cached features, backward into it (the C prompts "
                    "through the frozen text tower once per trial)",
    "coop": "the C prompts with the context through the 12 frozen text blocks, backward to the "
            "context; B cached features",
    "cocoop": "the meta-net on B cached features; each image's C prompts with its own context "
              "through the 12 frozen text blocks (B x C prompts), backward to the context and "
              "the meta-net",
    "maple": "B images decoded with the vision prompts through all 12 image blocks and back "
             "(they enter at block 0); the C prompts with the language prompts of blocks 0-8 "
             "through the 12 text blocks and back to the context",
    "mma": "B images decoded, 5 frozen image blocks without autograd, 7 with the adapters and "
           "backward through them; the C prompts' 7 adapted text blocks and back (their 5 frozen "
           "blocks once per trial)",
    "vacsr": "B images decoded, 11 frozen image blocks without autograd, the last block and "
             "projection with backward; the C prompts' last text block and projection (their 11 "
             "frozen blocks once per trial); the adapter on B x C pairs",
}
VACSR_SIDE = ("model.trainable_image_blocks=1", "model.trainable_text_blocks=1",
              "model.trainable_side=last")


@dataclass
class Trial:
    """One method's measured trial: its feature pass (frozen methods) and its training."""

    method: str
    images: int  # training images (or their features)
    steps: int
    served: int  # training images whose prefix output the cache gave back
    feature_cpu: float | None  # the pass computing (or reading back) the training features
    feature_wall: float | None
    train_cpu: float
    train_wall: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-B-16")
    parser.add_argument("--classes", type=int, default=10, choices=(5, 10),
                        help="EuroSAT's 5 base classes or all 10")
    parser.add_argument("--shots", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    parser.add_argument("--quick", action="store_true",
                        help="5 classes x 4 shots, 1 epoch, batch 8 (overrides those flags)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the data and the prefix cache go (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.quick:
        args.classes, args.shots, args.epochs, args.batch_size = 5, 4, 1, 8
    return args


def protocol(method: str) -> list[str]:
    """The config values a method fixes, as overrides (as a sweep applies them)."""
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}"
            for key, value in METHODS[method].protocol.items()]


def config_for(method: str, args, root: Path, cache: Path):
    common = [f"model.name={args.model}", "model.use_gpo=false", "data.task=classification",
              "data.dataset=eurosat", f"data.root={root}", f"data.shots={args.shots}",
              f"data.subsample_classes={'all' if args.classes == 10 else 'base'}",
              "data.augment=false", f"data.prefix_cache_dir={cache}",
              f"train.batch_size={args.batch_size}", f"train.epochs={args.epochs}",
              "train.device=cpu", "train.progress=false", "train.resume=false",
              f"train.output_dir={root.parent / 'runs' / method}", f"adapter.kind={method}"]
    extra = list(VACSR_SIDE) if method == "vacsr" else protocol(method)
    return load_config(overrides=common + extra)


def measure(method: str, args, root: Path, cache: Path) -> Trial:
    run = Trainer(config_for(method, args, root, cache))  # model building: not timed
    feature_cpu = feature_wall = None
    wall, cpu = time.perf_counter(), time.process_time()
    dataset = run.train_dataset()  # frozen methods: the feature pass; VACSR: the image list
    if run.trains_on_features():
        feature_cpu, feature_wall = time.process_time() - cpu, time.perf_counter() - wall
    elif METHODS[method].frozen_image_tower:
        raise SystemExit(f"bench_method_costs: {method} does not train on cached features")
    steps = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for epoch in range(args.epochs):
        loader = run.train_loader(epoch, dataset)
        steps += len(loader)
        run.train_epoch(epoch, loader, show_progress=False)
    served = run.prefix_cache.stats.served if run.prefix_cache is not None else 0
    train_cpu, train_wall = time.process_time() - cpu, time.perf_counter() - wall
    trial = Trial(method, len(dataset), steps, served, feature_cpu, feature_wall, train_cpu,
                  train_wall)
    del run, dataset
    gc.collect()
    return trial


def planned_trials(trials: dict[str, Trial], args, root: Path, cache: Path) -> dict[str, float]:
    """Each method's trial as `--plan` composes it, in seconds: the costs measured here on
    VACSR's configuration (as a sweep calibrates on its first unit), the method's run settings,
    the trial's steps and images; no val pass (the measured trials run none)."""
    from vacsr.config import flatten
    from vacsr.data.generate import synthetic_classnames
    from vacsr.model.prompt_room import COUNT_KEY, INIT_KEY, text_positions
    from vacsr.sweep.cost import estimate as est
    from vacsr.sweep.cost.calibrate import measure_costs
    from vacsr.sweep.cost.counts import DatasetCounts, name_pieces
    from vacsr.sweep.spec.space import tower_depths

    vacsr = config_for("vacsr", args, root, cache)
    samples = tuple(str(p) for p in sorted(root.rglob("*")) if p.suffix in (".jpg", ".png"))[:8]
    costs = measure_costs(vacsr, samples, time.time())
    depths = tower_depths(args.model)
    pieces = name_pieces(synthetic_classnames("eurosat"), set(range(args.classes)))
    planned = {}
    for method in ORDER:
        values = flatten(config_for(method, args, root, cache))
        run = est.run_settings(values, depths)
        counts = DatasetCounts(train=trials[method].images, val=0, test=0, prompts=args.classes,
                               evaluations={})
        share = est.prompt_share((values[INIT_KEY],), (values[COUNT_KEY],), pieces,
                                 text_positions(args.model))
        planned[method] = (est.start_seconds(run, costs, counts)
                           + trials[method].steps * est.step_seconds(
                               run, costs, args.classes, depths,
                               share))
    return planned


def report_plan(trials: dict[str, Trial], planned: dict[str, float]) -> None:
    """--plan's trial against the measured one (its cold feature pass and its training)."""
    cold = next(t.feature_cpu for t in trials.values() if t.feature_cpu is not None)
    print(f"{'--plan':<14}{'planned s':>10}{'measured':>10}{'ratio':>8}")
    verdicts = []
    for method in ORDER:
        trial = trials[method]
        measured = trial.train_cpu + (cold if trial.feature_cpu is not None else 0.0)
        ratio = planned[method] / measured
        verdicts.append(f"{method} {ratio:.2f}x "
                        f"{'PASS' if abs(ratio - 1) <= PLAN_TOLERANCE else 'FAIL'}")
        print(f"{method:<14}{planned[method]:>10.2f}{measured:>10.2f}{ratio:>7.2f}x")
    print(f"SUMMARY --plan's trial / measured, target within 1 +- {PLAN_TOLERANCE}: "
          + "; ".join(verdicts))


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no lscpu)"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines()
                 if line.startswith("Model name")), "unknown")


def report(trials: dict[str, Trial], args) -> None:
    print(f"lscpu: {cpu_model()}; {args.threads} intra-op thread(s)")
    base = trials["vacsr"]
    print(f"{args.model} (random weights), 224 px, EuroSAT {args.classes} classes x {args.shots} "
          f"shots = {base.images} training images, batch {args.batch_size}, {args.epochs} "
          f"epoch(s), {base.steps} steps per trial; VACSR: {', '.join(VACSR_SIDE)}")
    print("per step (B = batch, C = classes):")
    for method in ORDER:
        print(f"  {method:<13} {PER_STEP[method]}")
    first = ORDER[0]
    for method in ORDER:
        trial = trials[method]
        if trial.feature_cpu is not None:
            how = "cold, computed and stored" if method == first else "warm, read back"
            print(f"feature pass ({method}, {how}): {trial.feature_cpu:.2f} CPU-s "
                  f"({trial.feature_wall:.2f} s wall; {trial.served} of {trial.images} images "
                  "from the cache)")
    vacsr = base.train_cpu  # the denominator of every ratio
    print(f"{'training':<14}{'steps':>6}{'CPU-s':>10}{'wall-s':>10}{'/ vacsr':>10}")
    for method in ORDER:
        trial = trials[method]
        print(f"{method:<14}{trial.steps:>6}{trial.train_cpu:>10.3f}{trial.train_wall:>10.3f}"
              f"{trial.train_cpu / vacsr:>9.4f}x")
    verdicts = []
    for method in COMPARED:
        ratio = trials[method].train_cpu / vacsr
        verdicts.append(f"{method}/vacsr {ratio:.4f}x {'PASS' if ratio <= TARGET else 'FAIL'}")
    print(f"SUMMARY training CPU-s, target <= {TARGET}x: " + "; ".join(verdicts)
          + " (" + ", ".join(f"{method}/vacsr {trials[method].train_cpu / vacsr:.4f}x"
                             for method in ORDER if method not in (*COMPARED, "vacsr"))
          + ", no target)")
    cold = trials[first].feature_cpu + trials[first].train_cpu
    print(f"with its cold feature pass (paid once per dataset, shared by its trials, seeds and "
          f"methods): {first} {cold:.2f} CPU-s, {cold / vacsr:.3f}x of VACSR's training")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from vacsr.data.generate import generate_all

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="vacsr-bench-methods-")).resolve()
    try:
        root = generate_all(workdir / "data", datasets=["eurosat"], size=224,
                            per_class=(args.shots, 1, 1))
        cache = workdir / "prefix-cache"
        with torch_threads(args.threads):
            trials = {method: measure(method, args, root, cache) for method in ORDER}
        sizes = {(trial.images, trial.steps) for trial in trials.values()}
        if len(sizes) != 1:
            raise SystemExit(f"bench_method_costs: the trials' (images, steps) differ: {sizes}")
        report(trials, args)
        with torch_threads(args.threads):
            planned = planned_trials(trials, args, root, cache)
        report_plan(trials, planned)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
