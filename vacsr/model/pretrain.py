"""Contrastive (CLIP) pretraining of a small open_clip model on synthetic data.

Real runs start from pretrained CLIP weights; a randomly initialised tiny model has no discriminative
features, and hardest-negative objectives such as L_sigma^N collapse from such a start (as VSE++
reports for its max-of-hinges loss). The demo and the tests therefore first pretrain the tiny model
with the InfoNCE loss and hand the result to vacsr as a local weights file, the same path a user's
own checkpoint takes.

The loop runs on one intra-op thread: its matrices are a few dozen wide, so a second thread mostly
waits (measured on 2 cores: 40% more CPU-seconds for 15% less wall time), and one thread gives the
same weights whatever the machine's core count. Each distinct caption is tokenized once, and
AdamW takes its fused kernel (one pass over the parameters instead of one per operation).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from vacsr.atomic import atomic_write
from vacsr.data.datasets import CaptionPairDataset
from vacsr.data.synthetic import synthetic_retrieval
from vacsr.errors import ConfigError
from vacsr.folder_lock import check_output_file
from vacsr.model.backbone import create_clip
from vacsr.model.weights import random_init_expected
from vacsr.seed import seed_everything
from vacsr.threads import torch_threads


def clip_loss(image_feats: torch.Tensor, text_feats: torch.Tensor, logit_scale: torch.Tensor,
              image_index: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE; captions of the same image are all targets (soft labels)."""
    logits = logit_scale.exp().clamp(max=100) * image_feats @ text_feats.T  # (B, B)
    targets = (image_index[:, None] == image_index[None, :]).float()
    loss_i2t = -(targets / targets.sum(1, keepdim=True) * F.log_softmax(logits, 1)).sum(1).mean()
    loss_t2i = -(targets / targets.sum(0, keepdim=True) * F.log_softmax(logits, 0)).sum(0).mean()
    return (loss_i2t + loss_t2i) / 2


def pretrain_clip(out_path: str | Path, *, name: str = "vacsr-tiny", num_images: int = 1024,
                  epochs: int = 6, batch_size: int = 128, lr: float = 2e-3, seed: int = 0,
                  image_size: int = 32, progress: bool = True) -> Path:
    """Train `name` from scratch with InfoNCE on synthetic pairs; save an open_clip state dict.
    Where the file cannot be written is known before the minutes of training (one line)."""
    out_path = check_output_file(out_path, "the pretrained weights")
    per_image = 5  # captions of each synthetic image
    if epochs < 1 or num_images * per_image < batch_size:  # OneCycleLR needs at least one step
        raise ConfigError(f"pretraining needs epochs >= 1 and num_images >= "
                          f"{-(-batch_size // per_image)} (one batch of {batch_size} image-caption "
                          f"pairs; the last partial batch is dropped), got epochs={epochs}, "
                          f"num_images={num_images}")
    seed_everything(seed)
    with random_init_expected():
        model, train_transform, _, tokenizer = create_clip(name)
    data = synthetic_retrieval(num_images, captions_per_image=per_image, image_size=image_size,
                               seed=seed + 777)
    loader = torch.utils.data.DataLoader(
        CaptionPairDataset(data, train_transform), batch_size=batch_size, shuffle=True,
        drop_last=True, generator=torch.Generator().manual_seed(seed))
    distinct = sorted(set(data.captions))
    tokens = dict(zip(distinct, tokenizer(distinct)))  # caption -> (context_length,) token ids
    with torch_threads(1):
        _train(model, loader, tokens, epochs=epochs, lr=lr, progress=progress)
    return atomic_write(out_path, lambda tmp: _save(model.state_dict(), tmp))


def _train(model, loader, tokens: dict[str, torch.Tensor], *, epochs: int, lr: float,
           progress: bool) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05, fused=True)
    total = epochs * len(loader)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total,
                                                   pct_start=0.1)
    bar = tqdm(total=total, desc="pretrain tiny CLIP", file=sys.stderr, disable=not progress,
               mininterval=1.0)
    model.train()
    for _ in range(epochs):
        for images, captions, image_index in loader:
            image_feats = model.encode_image(images, normalize=True)  # (B, D)
            text = torch.stack([tokens[caption] for caption in captions])  # (B, context_length)
            text_feats = model.encode_text(text, normalize=True)  # (B, D)
            loss = clip_loss(image_feats, text_feats, model.logit_scale, image_index)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()


def _save(state: dict, path: Path) -> None:
    """torch.save through a file object: the archive's inner folder is then named "archive",
    not after the (temporary) file, so one recipe gives the same bytes every time."""
    with open(path, "wb") as out:
        torch.save(state, out)
