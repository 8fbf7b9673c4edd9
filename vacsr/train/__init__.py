"""Training: optimiser and schedule, checkpoints, the local (single-process) training loop."""
