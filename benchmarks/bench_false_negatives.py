"""VACSR against the sigmoid baseline on a controlled false-negative problem (paper secs. 1, 4.3).

Items carry latent concept sets (vacsr/data/concepts.py); training labels are binary, so other
items of the same concept set in a batch are false negatives; evaluation counts every item of the
same concept set as relevant and reports semantic mAP@R, R-Precision and R@1 (the ECCV Caption
metrics, averaged over both directions as in Tables 3 and 6), plus the Pearson correlation between
a query's top-1 sigma_hat bin and that bin's R@1 (Fig. 3). Clean data, and 20% / 50% of training
texts permuted (noisy correspondence). The towers are linear maps from a shared "pretrained"
projection, the heads and losses are the project's own.

    .venv/bin/python benchmarks/bench_false_negatives.py            # the full table
    .venv/bin/python benchmarks/bench_false_negatives.py --rows baseline,vacsr_label --noise 0.5
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from adamp import AdamP
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vacsr.config import AdapterConfig, Config, set_value  # noqa: E402
from vacsr.data.concepts import (  # noqa: E402
    ConceptData,
    ConceptSpec,
    add_correspondence_noise,
    make_concept_data,
)
from vacsr.eval.metrics import rank_topk  # noqa: E402
from vacsr.eval.semantic import semantic_depth, semantic_metrics  # noqa: E402
from vacsr.eval.uncertainty import binned_recall  # noqa: E402
from vacsr.methods.registry import method_of  # noqa: E402
from vacsr.model.losses import sigmoid_loss, vacsr_loss  # noqa: E402

# Rows: (label, head kind, overrides of the paper defaults). Table 6 ablations included.
ROWS: dict[str, tuple[str, dict]] = {
    "baseline": ("sigmoid baseline (w/o all)", {"adapter.kind": "sigmoid_baseline"}),
    "recon_only": ("adapter, L_recon only", {"loss.use_kl": False, "loss.use_sigma_loss": False}),
    "vacsr_label": ("VACSR, neg target label", {"loss.neg_sigma_target": "label"}),
    "vacsr_positive": ("VACSR, neg target positive", {"loss.neg_sigma_target": "positive"}),
    "no_kl": ("w/o L_KL", {"loss.use_kl": False}),
    "no_sigma": ("w/o L_sigma", {"loss.use_sigma_loss": False}),
    "k1": ("w/o GMM (K = 1)", {"adapter.num_components": 1}),
    "unbounded": ("w/o sigmoid (exp sigma_hat)", {"adapter.bounded_sigma": False}),
    # where the gap to the baseline comes from (at the default adapter.init=cosine): no sampling
    # noise of z in training, then also a frozen head (the adapter stays the fixed 10 cos - 10)
    "recon_mean_z": ("L_recon only, z = mu", {"loss.use_kl": False, "loss.use_sigma_loss": False}),
    "label_mean_z": ("VACSR label, z = mu", {"loss.neg_sigma_target": "label"}),
    "recon_frozen": ("L_recon only, z = mu, head frozen",
                     {"loss.use_kl": False, "loss.use_sigma_loss": False}),
}
# how a row trains besides its config: sample z (None = in training mode), the head's lr factor
ROW_TRAINING: dict[str, dict] = {"recon_mean_z": {"sample": False},
                                 "label_mean_z": {"sample": False},
                                 "recon_frozen": {"sample": False, "head_lr_mult": 0.0}}
NOISE = (0.0, 0.2, 0.5)


class Towers(nn.Module):
    """Two linear towers from one shared projection; L2-normalised outputs. The backbone a
    method's head is built for here (`embed_dim`, as vacsr/model/backbone.py's)."""

    def __init__(self, projection: torch.Tensor) -> None:
        super().__init__()
        self.embed_dim = projection.shape[1]
        self.image = nn.Linear(projection.shape[0], projection.shape[1], bias=False)
        self.text = nn.Linear(projection.shape[0], projection.shape[1], bias=False)
        with torch.no_grad():
            self.image.weight.copy_(projection.T)
            self.text.weight.copy_(projection.T)

    def forward(self, images, texts):
        return F.normalize(self.image(images), dim=-1), F.normalize(self.text(texts), dim=-1)


def build_config(row: str, overrides: list[str]) -> Config:
    config = Config()
    config.adapter = replace(AdapterConfig(), hidden_dim=128)  # the same head for every row
    for key, value in ROWS[row][1].items():
        set_value(config, key, value)
    for text in overrides:
        key, raw = text.split("=", 1)
        set_value(config, key, __import__("yaml").safe_load(raw))
    return config


def train_run(data: ConceptData, config: Config, *, seed: int, epochs: int, batch: int,
              lr: float, tower_lr_mult: float, sample: bool | None = None,
              head_lr_mult: float = 1.0) -> tuple[Towers, nn.Module, dict]:
    torch.manual_seed(seed)
    towers = Towers(data.init_projection)
    head = method_of(config.adapter.kind).build_head(config.adapter, towers)
    optim = AdamP([{"params": towers.parameters(), "lr": lr * tower_lr_mult},
                   {"params": head.parameters(), "lr": lr * head_lr_mult}], weight_decay=1e-4)
    split, loss_kwargs = data.train, asdict(config.loss)
    loss_kwargs.pop("backbone_grad")  # the towers here always take every term's gradient
    gen = torch.Generator().manual_seed(seed)
    last, steps = {}, 0
    for epoch in range(epochs):
        hard = HardNegativeStats()  # of the last epoch
        order = torch.randperm(len(split.texts), generator=gen)
        for start in range(0, len(order) - batch + 1, batch):
            texts = order[start:start + batch]
            owners = split.text_owner[texts]
            v, t = towers(split.images[owners], split.texts[texts])
            labels = (owners[:, None] == owners[None, :]).float()  # (B, B)
            output = head(v, t, sample=sample)
            hard.add(output, labels, split.groups[owners])
            if output.sigma_hat is None:
                loss, parts = sigmoid_loss(output.logits, labels)
            else:
                loss, parts = vacsr_loss(output, labels, **loss_kwargs)
            if not torch.isfinite(loss):
                return towers, head, {"nonfinite_step": steps}
            optim.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_([*towers.parameters(), *head.parameters()], 2.0)
            optim.step()
            last, steps = {k: float(v) for k, v in parts.items()}, steps + 1
    return towers, head, {**last, **hard.result()}


class HardNegativeStats:
    """Over training steps: how often a row's hardest negative (the one L_sigma^N weighs) is a
    false negative (same concept set), and the factor 1 / sigma_hat by which L_sigma^N's push on
    its logit, (p - y') / sigma_hat, exceeds L_recon's (p - y) under the straight-through
    gradient."""

    def __init__(self) -> None:
        self.false_neg, self.inv_sigma, self.rows = 0.0, 0.0, 0

    @torch.no_grad()
    def add(self, output, labels: torch.Tensor, groups: torch.Tensor) -> None:
        negatives = output.logits.masked_fill(labels.bool(), float("-inf"))  # (B, B)
        hardest = negatives.argmax(dim=1)  # (B,)
        self.false_neg += float((groups[hardest] == groups).sum())
        if output.sigma_hat is not None:
            self.inv_sigma += float(output.sigma_hat.gather(1, hardest[:, None]).reciprocal().sum())
        self.rows += len(hardest)

    def result(self) -> dict[str, float]:
        rows = max(self.rows, 1)
        return {"hard_neg_false_frac": self.false_neg / rows,
                "hard_neg_inv_sigma": self.inv_sigma / rows if self.inv_sigma else float("nan")}


@torch.no_grad()
def evaluate(towers: Towers, head: nn.Module, data: ConceptData) -> dict[str, float]:
    """Semantic mAP@R / R-P / R@1 (vacsr.eval.semantic, same concept set = relevant), both
    directions and their mean; the Fig. 3 correlation of top-1 sigma_hat and R@1 (i2t)."""
    towers.eval()
    head.eval()
    split = data.test  # clean: text j describes image j
    v, t = towers(split.images, split.texts)
    logits, sigma = head.score_block(v, t)  # (N, N)
    owner = split.text_owner
    depth = semantic_depth(split.groups, owner)
    i2t, t2i = rank_topk(logits, depth["i2t"]), rank_topk(logits.T, depth["t2i"])
    out = semantic_metrics(i2t, t2i, split.groups, owner, prefix="")
    out.update(map_r=out["map_at_r"], rp=out["rprecision"])
    # binary R@1 (the exact pair, what the training labels reward), both directions
    images = torch.arange(len(split.groups))
    out["inst_r1"] = 50.0 * float((owner[i2t[:, 0]] == images).float().mean()
                                  + (t2i[:, 0] == owner).float().mean())
    if sigma is not None:
        correct = split.text_groups[i2t[:, 0]] == split.groups  # (N,) top-1 relevant
        top1_sigma = sigma.gather(1, i2t[:, :1]).squeeze(1)
        out["sigma_r1_pearson"] = binned_recall(top1_sigma.numpy(),
                                                correct.numpy())["pearson_bins"]
    return out


def run_cell(row: str, noise: float, seed: int, args) -> dict[str, float]:
    data = make_concept_data(ConceptSpec(), seed=seed)
    data = replace(data, train=add_correspondence_noise(data.train, noise, seed=seed))
    config = build_config(row, args.set)
    towers, head, last = train_run(data, config, seed=seed, epochs=args.epochs, batch=args.batch,
                                   lr=args.lr, tower_lr_mult=args.tower_lr_mult,
                                   **ROW_TRAINING.get(row, {}))
    if "nonfinite_step" in last:
        return {"map_r": float("nan"), "rp": float("nan"), "r1": float("nan"),
                "nonfinite_step": last["nonfinite_step"]}
    metrics = evaluate(towers, head, data)
    metrics.update({f"train_{k}": v for k, v in last.items()})
    return metrics


def _cell(values: list[float]) -> str:
    arr = np.asarray(values, dtype=float)
    if np.isnan(arr).any():
        return f"{'NaN':>12}"
    return f"{arr.mean():6.1f} ± {arr.std():3.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(ROWS),
                   help="comma-separated rows: " + ", ".join(ROWS))
    p.add_argument("--noise", default=",".join(str(n) for n in NOISE))
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--tower-lr-mult", type=float, default=0.3)
    p.add_argument("--set", action="append", default=[], help="config override for every row")
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    rows = [r for r in args.rows.split(",") if r]
    noises = [float(n) for n in args.noise.split(",") if n]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    started = time.time()
    print(f"concept-set data {ConceptSpec()}; {args.epochs} epochs, batch {args.batch}, "
          f"lr {args.lr}, seeds {seeds}; overrides {args.set or 'none'}", flush=True)
    baseline = build_config("baseline", []).adapter  # the untrained sigmoid head: cosine
    zero = [evaluate(towers, method_of(baseline.kind).build_head(baseline, towers), data)
            for towers, data in ((Towers(d.init_projection), d) for d in
                                 (make_concept_data(ConceptSpec(), seed=s) for s in seeds))]
    print(f"untrained towers (cosine): mAP@R {_cell([z['map_r'] for z in zero])}, "
          f"R@1 {_cell([z['r1'] for z in zero])}")
    header = (f"{'row':<34}{'noise':>6}{'mAP@R':>14}{'R-P':>14}{'R@1':>14}{'sigma-R@1 r':>13}"
              f"{'inst R@1':>14}{'hard neg FN':>12}{'1/sigma':>9}")
    print(header + "\n" + "-" * len(header), flush=True)
    for noise in noises:
        for row in rows:
            cells = [run_cell(row, noise, seed, args) for seed in seeds]
            pearson = [c.get("sigma_r1_pearson", float("nan")) for c in cells]
            corr = f"{np.nanmean(pearson):13.2f}" if not np.isnan(pearson).all() else f"{'-':>13}"
            false_neg = np.mean([c.get("train_hard_neg_false_frac", np.nan) for c in cells])
            inv_sigma = np.mean([c.get("train_hard_neg_inv_sigma", np.nan) for c in cells])
            print(f"{ROWS[row][0]:<34}{noise:>6.0%}{_cell([c['map_r'] for c in cells]):>14}"
                  f"{_cell([c['rp'] for c in cells]):>14}{_cell([c['r1'] for c in cells]):>14}"
                  f"{corr}{_cell([c.get('inst_r1', np.nan) for c in cells]):>14}"
                  f"{false_neg:>12.0%}{inv_sigma:>9.1f}", flush=True)
    print(f"\ndone in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
