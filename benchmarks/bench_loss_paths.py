"""VACSR vs the sigmoid baseline on the project's two real training paths, at the paper's defaults.

- retrieval: `vacsr demo`'s settings (tiny CLIP pretrained on synthetic pairs, GPO, 512 training
  images of 64 scenes, batch 64) for 20 epochs, clean and with 20% / 50% noisy correspondence
  (paper Table 3); COCO-style RSUM and R@1 plus the semantic mAP@R of the scene ground truth.
- classification: base-to-novel on synthetic datasets in their real layouts (2 shots, 8 epochs,
  cosine, batch 32; eurosat 10), base and novel test accuracy and H (paper Table 5 protocol).

Every row runs the given seeds; VACSR rows take `--set` overrides (the loss formulation), every
row `--all-set` ones (the backbone's trainable blocks), the baseline is GPO + sigmoid loss ("w/o
all components", Table 6). Runs go two at a time.

    .venv/bin/python benchmarks/bench_loss_paths.py --path retrieval
    .venv/bin/python benchmarks/bench_loss_paths.py --path classification --datasets caltech101,dtd
"""
from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS = {"baseline": ["adapter.kind=sigmoid_baseline"],
        "vacsr_label": ["loss.neg_sigma_target=label"],
        "vacsr_positive": ["loss.neg_sigma_target=positive"]}
RETRIEVAL_KEYS = ("rsum", "i2t_r1", "t2i_r1", "sem_map_at_r")
CLASSIFICATION = ["data.task=classification", "model.use_gpo=false", "data.shots=2",
                  "data.subsample_classes=base", "train.epochs=8", "train.batch_size=32",
                  "optim.lr=2e-3", "optim.schedule=cosine", "adapter.hidden_dim=64",
                  "model.trainable_image_blocks=0", "model.trainable_text_blocks=0"]
# eurosat has 5 base classes, so 2 shots are 10 training images: less than one batch of 32
DATASET_OVERRIDES = {"eurosat": ["train.batch_size=10"]}


def _run(job: tuple) -> dict:
    """One training run in a fresh process: (path, row overrides, seed, workdir, extra)."""
    import torch

    torch.set_num_threads(1)
    from vacsr.config import load_config
    from vacsr.demo import demo_overrides
    from vacsr.errors import ConfigError
    from vacsr.train.eval_pass import evaluate_checkpoint
    from vacsr.train.loop import Trainer

    path, overrides, seed, workdir, weights, data_root = job
    out = Path(workdir)
    if path == "retrieval":
        base = demo_overrides(Path(weights), out, 20)
    else:
        base = [f"model.pretrained={weights}", f"train.output_dir={out}", "train.resume=false",
                f"data.root={data_root}", *CLASSIFICATION]
    config = load_config(overrides=[*base, "train.progress=false", f"train.seed={seed}",
                                    *overrides])
    try:
        result = Trainer(config).fit()
    except FloatingPointError:
        return {"nonfinite": 1.0}
    except ConfigError as error:  # one bad setting must not lose the other runs' table
        return {"error": str(error)}
    final = {k[len("test/"):]: v for k, v in result.final_metrics.items() if k.startswith("test/")}
    final.update({k: v for k, v in result.final_metrics.items() if k.startswith("train/sigma_hat")})
    if path == "retrieval":  # Fig. 3: top-1 sigma_hat bin vs that bin's R@1, both directions
        final["sigma_r1_pearson"] = float(np.nanmean([final.get(f"uncertainty_{d}_pearson", np.nan)
                                                      for d in ("i2t", "t2i")]))
    if path == "classification":
        novel = evaluate_checkpoint(config, result.checkpoint, subsample="novel")
        final["base"], final["novel"] = final["acc"], novel["acc"]
    return final


def _fmt(values) -> str:
    arr = np.asarray(values, dtype=float)
    return f"{'NaN':>13}" if np.isnan(arr).any() else f"{arr.mean():7.1f} ± {arr.std():3.1f}"


def _jobs(args, weights: Path, data_root: Path | None):
    jobs, keys = [], []
    noises = [float(n) for n in args.noise.split(",")] if args.path == "retrieval" else [None]
    datasets = args.datasets.split(",") if args.path == "classification" else [None]
    for setting in (noises if args.path == "retrieval" else datasets):
        for row in args.rows.split(","):
            extra = [*args.all_set, *ROWS[row], *([] if row == "baseline" else args.set)]
            if args.path == "retrieval":
                extra = [*extra, f"data.noise_ratio={setting}"]
            else:
                extra = [*DATASET_OVERRIDES.get(setting, []), *extra, f"data.dataset={setting}"]
            for seed in args.seeds.split(","):
                folder = args.workdir / "runs" / f"{setting}-{row}-seed{seed}"
                jobs.append((args.path, extra, int(seed), str(folder), str(weights),
                             str(data_root)))
                keys.append((setting, row))
    return jobs, keys


def _table(path: str, keys, results) -> list[str]:
    grouped: dict = {}
    for key, result in zip(keys, results):
        grouped.setdefault(key, []).append(result)
    lines = []
    for (setting, row), runs in grouped.items():
        label = f"{setting:>5.0%}" if path == "retrieval" else f"{setting:<15}"
        if any("error" in r for r in runs):
            lines.append(f"{label} {row:<16} failed: "
                         f"{next(r['error'] for r in runs if 'error' in r)}")
            continue
        if any("nonfinite" in r for r in runs):
            lines.append(f"{label} {row:<16} non-finite loss in "
                         f"{sum('nonfinite' in r for r in runs)} run(s)")
            continue
        if path == "retrieval":
            cells = [_fmt([r.get(k, np.nan) for r in runs]) for k in RETRIEVAL_KEYS]
        else:
            base = [r["base"] for r in runs]
            novel = [r["novel"] for r in runs]
            b, n = float(np.mean(base)), float(np.mean(novel))
            cells = [_fmt(base), _fmt(novel), f"{2 * b * n / (b + n) if b + n else 0:13.1f}"]
        sig = [r.get("train/sigma_hat_pos", np.nan) for r in runs]
        hard = [r.get("train/sigma_hat_hard_neg", np.nan) for r in runs]
        sigma = f"{np.mean(sig):6.3f}/{np.mean(hard):.3f}" if not np.isnan(sig).any() else "-"
        if path == "retrieval":
            corr = [r.get("sigma_r1_pearson", np.nan) for r in runs]
            sigma += (f"  {np.nanmean(corr):+.2f} ± {np.nanstd(corr):.2f}" if row != "baseline"
                      else "")
        lines.append(f"{label} {row:<16}" + "".join(f"{c:>15}" for c in cells) + f"  {sigma}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--path", choices=("retrieval", "classification"), required=True)
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--noise", default="0,0.2,0.5")
    p.add_argument("--datasets", default="caltech101,oxford_flowers,ucf101,food101,dtd,eurosat")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--set", action="append", default=[], help="override for the VACSR rows")
    p.add_argument("--all-set", action="append", default=[],
                   help="override for every row, the baseline's too (e.g. the trainable blocks)")
    p.add_argument("--workdir", type=Path, default=Path("bench_out/loss_paths"))
    p.add_argument("--processes", type=int, default=2)
    args = p.parse_args(argv)
    args.workdir = args.workdir.resolve()
    from vacsr.data.generate import generate_all
    from vacsr.model.pretrain import pretrain_clip

    started = time.time()
    weights = args.workdir / "tiny-clip.pt"
    if not weights.is_file():
        pretrain_clip(weights, progress=False)
    data_root = None
    if args.path == "classification":
        data_root = args.workdir / "data"
        generate_all(data_root, datasets=args.datasets.split(","))
    jobs, keys = _jobs(args, weights, data_root)
    print(f"{args.path}: {len(jobs)} runs, VACSR overrides {args.set or 'none (paper defaults)'}"
          f", every row's {args.all_set or 'none'}", flush=True)
    with ProcessPoolExecutor(args.processes) as pool:
        results = list(pool.map(_run, jobs))
    cols = RETRIEVAL_KEYS if args.path == "retrieval" else ("base", "novel", "H")
    print(f"{'':<22}" + "".join(f"{c:>15}" for c in cols) + "  sigma_hat pos/hard-neg"
          + ("  sigma-R@1 r" if args.path == "retrieval" else ""))
    print("\n".join(_table(args.path, keys, results)))
    print(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
