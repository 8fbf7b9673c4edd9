"""Feature-cache speed: trial-time loading of features from the Parquet cache vs re-encoding.

An adapter-only trial needs the frozen backbone's features of its train / val / test images and of
the class prompts. Without the cache every trial decodes, transforms and encodes them; with it, a
trial checks the key (paths, sizes, mtimes) and reads the Parquet files. Both are timed in one run
on the same data and the ratio is printed.

    .venv/bin/python benchmarks/bench_feature_cache.py                  # synthetic, vacsr-tiny
    .venv/bin/python benchmarks/bench_feature_cache.py --root /data --dataset oxford_pets \
        --model ViT-B-32 --pretrained openai --shots 16
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vacsr.data.classification import load_classification
from vacsr.data.encoding import encode_images, encode_texts
from vacsr.data.feature_cache import FeatureCache, backbone_identity, cache_classification
from vacsr.data.generate import generate
from vacsr.model.backbone import ClipBackbone


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="data root (default: generate synthetic data in a temp dir)")
    parser.add_argument("--dataset", default="caltech101")
    parser.add_argument("--model", default="vacsr-tiny")
    parser.add_argument("--pretrained", default=None)
    parser.add_argument("--shots", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def reencode(backbone, splits, args) -> list:
    """What a trial does without the cache: every image and prompt through the backbone."""
    out = []
    for data in splits.values():
        out.append(encode_images(backbone, data.images, batch_size=args.batch_size,
                                 num_workers=args.workers))
        out.append(encode_texts(backbone, data.prompts()))
    return out


def from_cache(cache, backbone, splits, args) -> list:
    """What a trial does with the cache: key check + Parquet read, into torch tensors."""
    out = []
    for name, data in splits.items():
        images, prompts = cache_classification(cache, backbone, data, f"{args.dataset}-{name}",
                                               batch_size=args.batch_size,
                                               num_workers=args.workers)
        assert not images.built and not prompts.built, "cache miss during the timed run"
        out += [torch.from_numpy(images.features), torch.from_numpy(prompts.features)]
    return out


def timed(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="vacsr_bench_"))
    root = Path(args.root) if args.root else work / "data"
    if not args.root:
        generate(root, args.dataset, seed=0)
    splits = load_classification(root, args.dataset, shots=args.shots, seed=1, subsample="all")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backbone = ClipBackbone(name=args.model, pretrained=args.pretrained, use_gpo=False)
    backbone = backbone.to(device).eval()
    cache = FeatureCache(work / "cache", backbone_identity(backbone, name=args.model,
                                                           pretrained=args.pretrained))
    start = time.perf_counter()
    for name, data in splits.items():  # the first trial fills the cache
        cache_classification(cache, backbone, data, f"{args.dataset}-{name}",
                             batch_size=args.batch_size, num_workers=args.workers)
    build = time.perf_counter() - start
    encode_s = timed(lambda: reencode(backbone, splits, args), args.repeats)
    cache_s = timed(lambda: from_cache(cache, backbone, splits, args), args.repeats)
    images = sum(len(d.images) for d in splits.values())
    print(f"dataset={args.dataset} model={args.model} device={device} images={images} "
          f"splits={','.join(splits)}")
    print(f"cache build (first trial): {build:.3f} s")
    print(f"re-encode per trial:       {encode_s:.3f} s")
    print(f"load from cache per trial: {cache_s:.4f} s")
    print(f"speed-up (re-encode / cache): {encode_s / cache_s:.1f}x")


if __name__ == "__main__":
    main()
