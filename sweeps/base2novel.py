"""Base-to-novel generalisation (paper sec. 4.3, Table 5): train on the base half of each dataset's
classes (16 shots), select on val, report base and novel accuracy and their harmonic mean H.

    ray job submit --working-dir . -- python sweeps/base2novel.py [options]

With no options it runs the embedded default (vacsr/sweep/plan/embedded.yaml): a local Ray instance,
synthetic data written in the real on-disk layouts, the tiny open_clip model, SQLite MLflow.
"""
import sys

try:  # a job whose `python` lacks vacsr fails here, in one line (README: Ray cluster)
    from vacsr.sweep.cli import main
except ImportError as exc:
    sys.exit(print(f"vacsr: error: {sys.executable} cannot import vacsr or its dependencies "
                   f"({exc}); run the job with vacsr's interpreter", file=sys.stderr) or 2)
from vacsr.sweep.spec.kind import Compared, Evaluation, SweepKind, Table
from vacsr.sweep.spec.paper import (
    ADAPTER_SPACE,
    BACKBONE_SPACE,
    BASE_TO_NOVEL_BATCH_SIZES,
    PUBLISHED_BASE_TO_NOVEL,
    PUBLISHED_NOTE,
)
from vacsr.sweep.spec.space import LogFloat

SWEEP = SweepKind(
    name="base2novel",
    task="classification",
    datasets=tuple(BASE_TO_NOVEL_BATCH_SIZES),
    batch_sizes=BASE_TO_NOVEL_BATCH_SIZES,
    metric="val/acc",
    space={**ADAPTER_SPACE, **BACKBONE_SPACE, "optim.lr": LogFloat(1e-4, 3e-3)},
    protocol={"optim.schedule": "cosine"},  # MMA's recipe (C.2)
    train_classes="base",
    evaluations=(Evaluation("novel_acc", classes="novel"),),  # zero-shot on the unseen half
    table=Table(columns=(("base", "acc"), ("novel", "novel_acc")), harmonic=("base", "novel"),
                published=PUBLISHED_BASE_TO_NOVEL,
                published_note=f"11-dataset avg., {PUBLISHED_NOTE}",
                # the methods compared by H per dataset, over (dataset, seed) pairs
                comparison=Compared(score="H", columns=(("base", "acc"), ("novel", "novel_acc")),
                                    harmonic=("base", "novel"))),
)

if __name__ == "__main__":
    sys.exit(main(SWEEP))
