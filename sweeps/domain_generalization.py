"""Domain generalisation (paper sec. 4.4, Table 4): train on ImageNet (16 shots, all classes),
select on val, then evaluate the same checkpoint on ImageNet-V2, -Sketch, -A and -R.

Submit it with `ray job submit --working-dir . -- python sweeps/domain_generalization.py`, or run
it as a plain script; without --data-root it runs on the embedded profile's synthetic ImageNet
and its four shifts.
"""
import sys

try:  # a job whose `python` lacks vacsr fails here, in one line (README: Ray cluster)
    from vacsr.sweep.cli import main
except ImportError as exc:
    sys.exit(print(f"vacsr: error: {sys.executable} cannot import vacsr or its dependencies "
                   f"({exc}); run the job with vacsr's interpreter", file=sys.stderr) or 2)
from vacsr.sweep.spec import paper
from vacsr.sweep.spec.kind import Compared, Evaluation, SweepKind, Table
from vacsr.sweep.spec.space import LogFloat

SHIFTS = paper.DOMAIN_SHIFTS  # ImageNet-V2, -Sketch, -A, -R

SWEEP = SweepKind(
    name="domain_generalization",
    task="classification",
    datasets=("imagenet",),
    batch_sizes={"imagenet": paper.BASE_TO_NOVEL_BATCH_SIZES["imagenet"]},
    metric="val/acc",
    space={**paper.ADAPTER_SPACE, "optim.lr": LogFloat(1e-4, 3e-3)},
    # C.2: the first 2 image and 3 text blocks train, 5 epochs, cosine annealing (not searched)
    protocol={"model.trainable_image_blocks": 2, "model.trainable_text_blocks": 3,
              "model.trainable_side": "first",
              "train.epochs": 5, "optim.schedule": "cosine"},
    evaluations=tuple(Evaluation(f"{shift}_acc", dataset=shift) for shift in SHIFTS),
    averages={"ood_avg_acc": tuple(f"{shift}_acc" for shift in SHIFTS)},
    # the methods compared per target (ImageNet, then each shift) and on the shifts' average
    # (ood_avg_acc), which ranks them
    table=Table(published=paper.PUBLISHED_DOMAIN_GENERALIZATION,
                published_note=f"Table 4, {paper.PUBLISHED_NOTE}",
                comparison=Compared(
                    score="accuracy",
                    targets=(("imagenet", "acc"), *((s, f"{s}_acc") for s in SHIFTS)),
                    average="shifted average", average_over=SHIFTS, per_row=True)),
)

if __name__ == "__main__":
    sys.exit(main(SWEEP))
