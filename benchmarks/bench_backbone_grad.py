"""What each loss term sends into the backbone's trainable blocks on the classification path.

Trains the rows of `bench_loss_paths.py --path classification` (same protocol: tiny CLIP, 2 shots,
8 epochs, lr 2e-3 cosine, batch 32; `--all-set` for the trainable blocks) with the trainer's own
epochs, and at every step measures, before clipping, the gradient norm at the backbone's
trainable parameters of each term: the baseline's sigmoid loss; VACSR's beta L_recon,
gamma (L_sigma^P + L_sigma^N) (and the part of it that flows through sigma_hat rather than p),
alpha L_KL, and the cosine between L_sigma's and L_recon's (paper sec. 3.2). These are the terms
of the whole loss whatever `loss.backbone_grad` lets through. After training: how far the novel
classes' prompt features moved from the pretrained model's (mean 1 - cos).

    .venv/bin/python benchmarks/bench_backbone_grad.py --datasets caltech101,oxford_flowers \
        --all-set model.trainable_side=first --all-set model.trainable_image_blocks=1 \
        --all-set model.trainable_text_blocks=1
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_loss_paths import CLASSIFICATION, ROWS  # noqa: E402

from vacsr.config import load_config  # noqa: E402
from vacsr.methods.build import build_model  # noqa: E402
from vacsr.model.losses import sigmoid_loss, vacsr_loss  # noqa: E402
from vacsr.train.loop import Trainer  # noqa: E402

TERMS = ("sigmoid", "recon", "sigma", "sigma_via_sigma_hat", "kl", "cos_sigma_recon")


def _flat_grad(loss: torch.Tensor, params: list) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten()
                      for g, p in zip(grads, params)])


def term_norms(run: Trainer, batch, step_seed: int, params: list) -> dict[str, float]:
    """Per-term backbone gradient norms of one batch, at the step's own noise."""
    pairs = run.task.features(batch).float()
    with torch.random.fork_rng():
        torch.manual_seed(step_seed)
        out = run.model.head(pairs.image_feats, pairs.text_feats)
    labels = pairs.labels()
    if out.sigma_hat is None:
        return {"sigmoid": _flat_grad(sigmoid_loss(out.logits, labels)[0], params).norm().item()}
    kw = run.task.loss_kwargs
    full = vacsr_loss(out, labels, **kw)[0]
    recon = vacsr_loss(out, labels, **{**kw, "use_kl": False, "use_sigma_loss": False})[0]
    with_kl = vacsr_loss(out, labels, **{**kw, "use_sigma_loss": False})[0]
    # logits detached: what is left of L_sigma flows through sigma_hat alone
    no_p = vacsr_loss(dataclasses.replace(out, logits=out.logits.detach()), labels, **kw)[0]
    g_recon, g_kl = _flat_grad(recon, params), _flat_grad(with_kl - recon, params)
    g_sigma = _flat_grad(full - with_kl, params)
    return {"recon": g_recon.norm().item(), "kl": g_kl.norm().item(),
            "sigma": g_sigma.norm().item(),
            "sigma_via_sigma_hat": (_flat_grad(no_p, params) - g_kl).norm().item(),
            "cos_sigma_recon": torch.nn.functional.cosine_similarity(g_sigma, g_recon,
                                                                     dim=0).item()}


def novel_prompt_drift(run: Trainer) -> float:
    """Mean 1 - cos between the novel prompts' features now and under the pretrained model."""
    config = run.config
    data = dataclasses.replace(config.data, subsample_classes="novel")
    novel = type(run.task).build_splits(data, config.train.seed)["test"]
    torch.manual_seed(0)
    pretrained = build_model(config).eval()
    tokens = run.model.backbone.tokenize(novel.prompts())
    run.model.eval()
    with torch.no_grad():
        now, before = run.model.encode_text(tokens), pretrained.encode_text(tokens)
    return float((1 - (now * before).sum(-1)).mean())


def measure(dataset: str, row: str, seed: int, args) -> dict:
    """One training run; per-term norms averaged over each epoch's steps, and the drift."""
    overrides = [f"model.pretrained={args.workdir / 'tiny-clip.pt'}", "train.resume=false",
                 f"train.output_dir={args.workdir / 'runs' / f'{dataset}-{row}-seed{seed}'}",
                 f"data.root={args.workdir / 'data'}", *CLASSIFICATION, "train.progress=false",
                 f"train.seed={seed}", f"data.dataset={dataset}", *args.all_set, *ROWS[row],
                 *([] if row == "baseline" else args.set)]
    run = Trainer(load_config(overrides=overrides))
    params = [p for name, p in run.model.named_parameters()
              if p.requires_grad and name.startswith("backbone.clip.")]
    per_epoch: list[list[dict]] = []

    def loss_fn(batch, step_seed):
        per_epoch[-1].append(term_norms(run, batch, step_seed, params))
        return run.compute_loss(batch, None, step_seed)  # the step the trainer takes

    dataset_ = run.train_dataset()
    for epoch in range(run.config.train.epochs):
        per_epoch.append([])
        run.train_epoch(epoch, run.train_loader(epoch, dataset_), loss_fn=loss_fn)
    means = [{k: float(np.mean([s[k] for s in steps])) for k in steps[0]} for steps in per_epoch]
    return {"first": means[0], "last": means[-1], "drift": novel_prompt_drift(run)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="caltech101,oxford_flowers")
    p.add_argument("--rows", default="baseline,vacsr_label")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--set", action="append", default=[], help="override for the VACSR rows")
    p.add_argument("--all-set", action="append", default=[], help="override for every row")
    p.add_argument("--workdir", type=Path, default=Path("bench_out/backbone_grad"))
    args = p.parse_args(argv)
    args.workdir = args.workdir.resolve()
    from vacsr.data.generate import generate_all
    from vacsr.model.pretrain import pretrain_clip

    torch.set_num_threads(1)
    started = time.time()
    if not (args.workdir / "tiny-clip.pt").is_file():
        pretrain_clip(args.workdir / "tiny-clip.pt", progress=False)
    generate_all(args.workdir / "data", datasets=args.datasets.split(","))
    print(f"every row's {args.all_set or 'none'}, VACSR's {args.set or 'none'}; gradient norms at "
          "the backbone's trainable parameters, before clipping, first / last epoch")
    print(f"{'':<30}" + "".join(f"{t:>22}" for t in TERMS) + f"{'novel drift':>14}")
    for dataset in args.datasets.split(","):
        for row in args.rows.split(","):
            runs = [measure(dataset, row, int(s), args) for s in args.seeds.split(",")]
            cells = []
            for term in TERMS:
                if term not in runs[0]["first"]:
                    cells.append(f"{'-':>22}")
                    continue
                first, last = (np.mean([r[when][term] for r in runs]) for when in ("first", "last"))
                cells.append(f"{first:>13.3g} / {last:<6.3g}")
            drift = np.mean([r["drift"] for r in runs])
            print(f"{dataset:<15} {row:<14}" + "".join(cells) + f"{drift:>14.4f}", flush=True)
    print(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
