"""Folder-listing cache speed: the first ImageNet load lists every image file, later loads read the
cached listing (vacsr/data/listing_cache.py, after CoOp's preprocessed.pkl).

Generates the ImageNet layout the loader reads (imagenet/classnames.txt, images/train/<wnid>/
<wnid>_<n>.JPEG, images/val/<wnid>/ILSVRC2012_val_<n>.JPEG; empty files) and times, in one run and
through the real loaders, at three depths (the listing alone, the ImageNet reader, a trial's whole
data load with its few-shot sample already cached, as from the second trial on):
- uncached: VACSR_LISTING_CACHE=off, every class folder is listed on every load, as before;
- first load: no cache file yet, every class folder is listed and the cache file written;
- cached: the load that follows, reading the cache file.

    .venv/bin/python benchmarks/bench_listing_cache.py                 # 200,000 train files in /tmp
    .venv/bin/python benchmarks/bench_listing_cache.py --root /nfs/scratch/listing-bench
    .venv/bin/python benchmarks/bench_listing_cache.py --cold   # as root: page cache dropped

--cold drops the kernel's page, dentry and inode caches before every timed load (Linux, root):
each load then reads the file system as the first load of a trial on a fresh node, or a network
file system whose client cache has expired, does; warm loads are what a second load on the same
machine sees.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vacsr.data.classification import load_classification
from vacsr.data.generate import imagenet_classnames, imagenet_wnids
from vacsr.data.imagenet import read_imagenet
from vacsr.data.listing_cache import RACY_NS, cache_paths, list_tree

SPLITS = ("train", "val")


@dataclass(frozen=True)
class Row:
    what: str
    uncached_s: float
    first_s: float
    cached_s: float

    @property
    def ratio(self) -> float:
        """What every load cost before, over what a cached load costs."""
        return self.uncached_s / self.cached_s


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="data root to generate into (or reuse); default: a temp dir")
    parser.add_argument("--classes", type=int, default=1000, help="the trial load expects 1000")
    parser.add_argument("--train-per-class", type=int, default=200)
    parser.add_argument("--val-per-class", type=int, default=50)
    parser.add_argument("--shots", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold", action="store_true",
                        help="drop the page cache before every timed load (needs root)")
    return parser.parse_args()


def generate_tree(root: Path, args: argparse.Namespace) -> int:
    """Empty image files in the ImageNet layout; returns the number of files written."""
    dataset = root / "imagenet"
    wnids = imagenet_wnids(args.classes)
    names = imagenet_classnames(args.classes)
    (dataset / "images").mkdir(parents=True)
    (dataset / "classnames.txt").write_text("".join(f"{w} {n}\n" for w, n in zip(wnids, names)))
    rng = random.Random(0)
    count = 0
    for label, wnid in enumerate(wnids):
        train = [f"{wnid}_{n}.JPEG" for n in rng.sample(range(1, 50_000), args.train_per_class)]
        val = [f"ILSVRC2012_val_{label * args.val_per_class + n + 1:08d}.JPEG"
               for n in range(args.val_per_class)]
        for split, files in zip(SPLITS, (train, val)):
            folder = dataset / "images" / split / wnid
            folder.mkdir(parents=True)
            for name in files:
                os.close(os.open(folder / name, os.O_CREAT | os.O_WRONLY, 0o644))
            count += len(files)
    return count


def split_dirs(root: Path) -> list[Path]:
    return [root / "imagenet" / "images" / split for split in SPLITS]


def drop_listing_cache(root: Path) -> None:
    for split_dir in split_dirs(root):
        for path in cache_paths(split_dir.resolve()):
            path.unlink(missing_ok=True)


COLD = False  # set by --cold
CACHED_LOADS = 5


def drop_page_cache() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def seconds(load: Callable[[], object]) -> float:
    if COLD:
        drop_page_cache()
    start = time.perf_counter()
    load()
    return time.perf_counter() - start


def measure(what: str, load: Callable[[], object], root: Path, repeats: int) -> Row:
    """Medians over `repeats` rounds of: an uncached load, a first load, and CACHED_LOADS cached
    loads after it (each load after the first is a cached one: a sweep's later trials)."""
    uncached, first, cached = [], [], []
    for _ in range(repeats):
        os.environ["VACSR_LISTING_CACHE"] = "off"
        uncached.append(seconds(load))
        del os.environ["VACSR_LISTING_CACHE"]
        drop_listing_cache(root)
        first.append(seconds(load))
        cached.extend(seconds(load) for _ in range(CACHED_LOADS))
    return Row(what, *(statistics.median(t) for t in (uncached, first, cached)))


def print_table(rows: list[Row]) -> None:
    print(f"{'load':<48} {'uncached':>10} {'first load':>11} {'cached':>9} {'speed-up':>9}")
    for row in rows:
        print(f"{row.what:<48} {row.uncached_s:>8.3f} s {row.first_s:>9.3f} s "
              f"{row.cached_s:>7.3f} s {row.ratio:>8.1f}x")


def main() -> None:
    global COLD
    args = parse_args()
    COLD = args.cold
    temp = None if args.root else Path(tempfile.mkdtemp(prefix="vacsr_listing_bench_"))
    root = Path(args.root) if args.root else temp / "data"
    try:
        if (root / "imagenet").is_dir():
            print(f"reusing {root / 'imagenet'}")
        else:
            start = time.perf_counter()
            files = generate_tree(root, args)
            print(f"generated {files:,} empty files in {time.perf_counter() - start:.1f} s "
                  f"under {root}")
            # The cache does not vouch for folders modified in the last RACY_NS: let them age,
            # as a real dataset has.
            time.sleep(RACY_NS / 1e9 + 0.1)
        # Untimed: the first trial draws and caches the few-shot sample; later trials read it.
        load_classification(root, "imagenet", shots=args.shots, seed=1)
        os.environ.pop("VACSR_LISTING_CACHE", None)
        rows = [
            measure("listing (list_tree, train + val)",
                    lambda: [list_tree(d) for d in split_dirs(root)], root, args.repeats),
            measure("ImageNet reader (read_imagenet)", lambda: read_imagenet(root), root,
                    args.repeats),
            measure(f"trial data load (load_classification, {args.shots} shots)",
                    lambda: load_classification(root, "imagenet", shots=args.shots, seed=1),
                    root, args.repeats),
        ]
        print(f"page cache: {'dropped before every timed load (cold)' if COLD else 'warm'}")
        print_table(rows)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
