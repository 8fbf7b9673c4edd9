"""Image-text retrieval (paper sec. 4.2, Tables 1-3): fine-tune on COCO's Karpathy train split,
select on val RSUM, report COCO 5K / 1K recalls (and ECCV / CxC where their annotations are given).

    ray job submit --working-dir . -- python sweeps/retrieval.py [options]

With no options it runs the embedded default (vacsr/sweep/plan/embedded.yaml).
"""
import sys

try:  # a job whose `python` lacks vacsr fails here, in one line (README: Ray cluster)
    from vacsr.sweep.cli import main
except ImportError as exc:
    sys.exit(print(f"vacsr: error: {sys.executable} cannot import vacsr or its dependencies "
                   f"({exc}); run the job with vacsr's interpreter", file=sys.stderr) or 2)
from vacsr.sweep.spec.kind import Compared, SweepKind, Table
from vacsr.sweep.spec.paper import ADAPTER_SPACE
from vacsr.sweep.spec.space import LogFloat

SWEEP = SweepKind(
    name="retrieval",
    task="retrieval",
    datasets=("coco",),
    also_accepts=("synthetic",),
    metric="val/rsum",
    space={**ADAPTER_SPACE, "optim.backbone_lr_mult": LogFloat(0.01, 0.3)},
    # C.2 (PCME++'s recipe): AdamP, lr 5e-4 decayed to 10% at epoch 15 of 25 (fixed, so the lr
    # is not searched)
    protocol={"optim.schedule": "step", "optim.lr": 5e-4, "optim.decay_factor": 0.1,
              "train.epochs": 25},
    # the methods compared by RSUM (vacsr/eval/metrics.py), R@1 both ways and ECCV Caption's
    # mAP@R where the test set is COCO 5K; one noise ratio per sweep, named in the header
    table=Table(comparison=Compared(
        score="RSUM", columns=(("RSUM", "rsum"), ("R@1 i2t", "i2t_r1"), ("R@1 t2i", "t2i_r1"),
                               ("ECCV mAP@R i2t", "eccv_map_at_r_i2t"),
                               ("ECCV mAP@R t2i", "eccv_map_at_r_t2i")),
        optional=("ECCV mAP@R i2t", "ECCV mAP@R t2i"),
        setting=(("noise ratio of the training captions (0 = clean)", "data.noise_ratio"),))),
)

if __name__ == "__main__":
    sys.exit(main(SWEEP))
