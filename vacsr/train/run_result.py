"""A training run's result, as `Trainer.fit` returns it and the run's logger receives it when the
run finishes (its own module: vacsr/train/run_hooks.py names it, and vacsr/train/loop.py imports
those hooks)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TrainResult:
    history: list[dict] = field(default_factory=list)  # one metrics dict per epoch
    final_metrics: dict = field(default_factory=dict)
    checkpoint: Path | None = None
    notes: tuple[str, ...] = ()  # lines a Ray run reported for the console (not metrics)

    @classmethod
    def of_history(cls, history: list[dict], checkpoint: Path | None) -> TrainResult:
        """A run's result from its history: the final metrics are its last epoch's."""
        return cls(history=history, final_metrics=history[-1] if history else {},
                   checkpoint=checkpoint)
