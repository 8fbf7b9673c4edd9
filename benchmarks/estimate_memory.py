"""Estimated peak memory of one training step at the paper's scale (no GPU needed).

    .venv/bin/python benchmarks/estimate_memory.py [--batch-size 128] [--image-blocks N ...]

ViT-B/32 and ViT-B/16 (arXiv 2605.30968), bf16 autocast and fp32, for a retrieval step (B images,
B captions, GPO over all tokens; `--texts C` for a classification step, whose text side is the C
class prompts) with the config's trainable-block default (-1: every block of both
towers trains). The formula and what it leaves out are in vacsr/model/memory.py;
benchmarks/gpu_train_step.py measures the same step on a GPU.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vacsr.config import ModelConfig  # noqa: E402
from vacsr.model.memory import estimate_step_memory  # noqa: E402

GIB = 2**30
COLUMNS = ("weights", "optimizer", "casts", "activations", "adapter", "total")


def table(batch_size: int, image_blocks: int, text_blocks: int, use_gpo: bool,
          texts: int | None = None) -> list[str]:
    """One line per (model, dtype), figures in GiB."""
    lines = [f"{'model':<9} {'dtype':<5} " + " ".join(f"{c:>11}" for c in COLUMNS)]
    for name in ("ViT-B-32", "ViT-B-16"):
        for dtype in ("bf16", "fp32"):
            parts = estimate_step_memory(name, batch_size=batch_size, dtype=dtype,
                                         image_blocks=image_blocks, text_blocks=text_blocks,
                                         use_gpo=use_gpo, texts=texts)
            lines.append(f"{name:<9} {dtype:<5} "
                         + " ".join(f"{parts[c] / GIB:11.2f}" for c in COLUMNS))
    return lines


def main(argv: list[str] | None = None) -> None:
    defaults = ModelConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-blocks", type=int, default=defaults.trainable_image_blocks)
    parser.add_argument("--text-blocks", type=int, default=defaults.trainable_text_blocks)
    parser.add_argument("--pooled", action="store_true", help="pooled CLIP features, no GPO")
    parser.add_argument("--texts", type=int, help="texts per step (default: the batch size; "
                        "classification: the number of classes)")
    args = parser.parse_args(argv)
    texts = args.batch_size if args.texts is None else args.texts
    blocks = lambda n: "all" if n == -1 else str(n)  # noqa: E731
    print(f"estimated peak memory of one training step (GiB): batch {args.batch_size} images + "
          f"{texts} texts, trainable blocks image {blocks(args.image_blocks)} / text "
          f"{blocks(args.text_blocks)}, {'pooled' if args.pooled else 'GPO'}")
    print("\n".join(table(args.batch_size, args.image_blocks, args.text_blocks, not args.pooled,
                           texts)))


if __name__ == "__main__":
    main()
