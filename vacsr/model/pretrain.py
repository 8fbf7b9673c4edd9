"""Contrastive (CLIP) pretraining of a small open_clip model on synthetic data.

Real runs start from pretrained CLIP weights; a randomly initialised tiny model has no
discriminative features, and hardest-negative objectives such as L_sigma^N collapse from such a
start (as VSE++ reports for its max-of-hinges loss). The demo and the tests therefore first
pretrain the tiny model with the InfoNCE loss and hand the result to vacsr as a local weights
file, the same path a user's own checkpoint takes.

The loop runs on one intra-op thread: its matrices are a few dozen wide, so a second thread mostly
waits (measured on 2 cores: 40% more CPU-seconds for 15% less wall time), and one thread gives the
same weights whatever the machine's core count. The pairs are held as tensors (PairTensors: each
image decoded and each distinct caption tokenized once, a batch's crops drawn in one resampling),
and AdamW takes its fused kernel (one pass over the parameters instead of one per operation).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torchvision.transforms import RandomResizedCrop
from torchvision.transforms.functional import pil_to_tensor
from tqdm import tqdm

from vacsr.atomic import atomic_write
from vacsr.data.base import RetrievalData, load_image
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
    pairs = PairTensors(data, tokenizer, train_transform, model.visual.preprocess_cfg)
    with torch_threads(1):
        _train(model, pairs, torch.Generator().manual_seed(seed), epochs=epochs,
               batch_size=batch_size, lr=lr, progress=progress)
    return atomic_write(out_path, lambda tmp: _save(model.state_dict(), tmp))


class PairTensors:
    """The pretraining pairs as tensors: each image decoded once, each distinct caption
    tokenized once. A batch applies the model's train augmentation (its RandomResizedCrop's
    scale and ratio, bicubic as it is) to all its images at once, as one resampling over
    continuous crop boxes where torchvision crops whole pixels image by image, then its
    normalisation."""

    def __init__(self, data: RetrievalData, tokenizer, train_transform,
                 preprocess_cfg: dict) -> None:
        [crop] = [t for t in train_transform.transforms if isinstance(t, RandomResizedCrop)]
        self.scale, self.log_ratio = crop.scale, (math.log(crop.ratio[0]), math.log(crop.ratio[1]))
        self.size = tuple(preprocess_cfg["size"])  # (H, W) the model takes
        self.mean = torch.tensor(preprocess_cfg["mean"]).view(1, 3, 1, 1)
        self.std = torch.tensor(preprocess_cfg["std"]).view(1, 3, 1, 1)
        self.images = torch.stack([pil_to_tensor(load_image(image).convert("RGB"))
                                   for image in data.images])  # (N, 3, h, w) uint8
        distinct = sorted(set(data.captions))
        row = {caption: i for i, caption in enumerate(distinct)}
        self.tokens = tokenizer(distinct)  # (distinct captions, context_length)
        self.caption_tokens = torch.tensor([row[c] for c in data.captions])  # (P,)
        self.caption_image = torch.tensor(data.caption_to_image)  # (P,)

    def __len__(self) -> int:
        return len(self.caption_image)

    def batch(self, pairs: torch.Tensor, generator: torch.Generator):
        """Pair indices (B,) -> (images (B, 3, H, W), tokens (B, context_length),
        image index (B,))."""
        image_index = self.caption_image[pairs]
        images = self.crops(self.images[image_index].float() / 255, generator)
        return (images - self.mean) / self.std, self.tokens[self.caption_tokens[pairs]], image_index

    def crops(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(B, 3, h, w) in [0, 1] -> one random crop of each, of area scale and aspect ratio
        drawn as RandomResizedCrop draws them, resized to (B, 3, H, W)."""
        count = images.shape[0]
        low, high = self.scale
        area = low + (high - low) * torch.rand(count, generator=generator)
        ratio = (self.log_ratio[0] + (self.log_ratio[1] - self.log_ratio[0])
                 * torch.rand(count, generator=generator)).exp()
        width = (area * ratio).sqrt().clamp(max=1)  # fractions of the image's side
        height = (area / ratio).sqrt().clamp(max=1)
        theta = torch.zeros(count, 2, 3)  # output grid -> input coordinates in [-1, 1]
        theta[:, 0, 0], theta[:, 1, 1] = width, height
        theta[:, 0, 2] = (1 - width) * (2 * torch.rand(count, generator=generator) - 1)
        theta[:, 1, 2] = (1 - height) * (2 * torch.rand(count, generator=generator) - 1)
        grid = F.affine_grid(theta, [count, 3, *self.size], align_corners=False)
        return F.grid_sample(images, grid, mode="bicubic", padding_mode="border",
                             align_corners=False)


def _train(model, pairs: PairTensors, generator: torch.Generator, *, epochs: int,
           batch_size: int, lr: float, progress: bool) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05, fused=True)
    steps = len(pairs) // batch_size  # the last partial batch is dropped
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr,
                                                   total_steps=epochs * steps, pct_start=0.1)
    bar = tqdm(total=epochs * steps, desc="pretrain tiny CLIP", file=sys.stderr,
               disable=not progress, mininterval=1.0)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(pairs), generator=generator)[:steps * batch_size]
        for batch in order.view(steps, batch_size):
            images, text, image_index = pairs.batch(batch, generator)
            image_feats = model.encode_image(images, normalize=True)  # (B, D)
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
