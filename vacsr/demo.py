"""Local end-to-end demo: pretrain the tiny CLIP (cached), fine-tune VACSR, print retrieval metrics.

The loss runs at the paper's defaults (appendix E: alpha 0.0005, beta 1, gamma 1, K 2, N_h 1).
"""
from __future__ import annotations

from pathlib import Path

from vacsr.config import load_config
from vacsr.folder_lock import check_output_file, check_output_folder
from vacsr.model.pretrained_cache import install_pretrained
from vacsr.results import format_metrics
from vacsr.train.loop import Trainer
from vacsr.train.run_folder import claim_run_folder


def demo_overrides(weights: Path, output_dir: Path, epochs: int) -> list[str]:
    return [f"model.pretrained={weights}", f"train.output_dir={output_dir}",
            f"train.epochs={epochs}", "train.batch_size=64", "train.resume=false",
            "optim.lr=1e-3", "optim.backbone_lr_mult=0.1", "optim.schedule=cosine",
            "data.num_train=512", "data.num_test=100", "adapter.hidden_dim=256"]


def run_demo(workdir: Path, epochs: int = 3) -> dict:
    workdir = workdir.expanduser().resolve()
    weights = workdir / "tiny-clip.pt"
    config = load_config(overrides=demo_overrides(weights, workdir / "runs" / "retrieval", epochs))
    # the folders first: a work folder that is a file would fail only after minutes of pretraining
    check_output_folder(workdir, "the demo (--workdir)")
    if not weights.is_file():
        check_output_file(weights, "the pretrained tiny CLIP")
    with claim_run_folder(config):
        install_pretrained(weights, progress=True)  # from the machine's cache: pretrained once
        trainer = Trainer(config)
        before = trainer.evaluate("test")
        result = trainer.fit()
    print("\nretrieval on the synthetic test split (100 images, 500 captions; chance R@1 = 1%)")
    print(f"{'metric':<16}{'untrained head':>16}{'after VACSR':>14}")
    for key in ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum"):
        print(f"{key:<16}{before[key]:>16.1f}{result.final_metrics[f'test/{key}']:>14.1f}")
    print(f"\nrun folder: {config.train.output_dir}")
    return result.final_metrics


__all__ = ["run_demo", "format_metrics"]
