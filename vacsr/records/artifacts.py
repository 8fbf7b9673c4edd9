"""The names of a sweep's MLflow artifacts, for the driver that writes them and `vacsr best`,
which reads the sweep back from the store alone.

A training run's own files (config.yaml, metrics.json) are named in vacsr/train/run_files.py.
"""
from __future__ import annotations

# the sweep's run
SWEEP_INFO = "sweep.json"  # kind, selection metric and the final table's spec
SWEEP_COST = "sweep_cost.json"  # what it was estimated to cost (`--plan`'s JSON)
# with --methods: what the method comparison is built from besides the units' results (its table
# spec, each method's budget, the methods and the units, in order), so that `vacsr best
# --compare` rebuilds report/comparison.md from the store
COMPARISON_INFO = "comparison_info.json"
# each dataset's run
BEST_CONFIG = "best_config.yaml"  # the selected config, as `vacsr train --config` takes it
FINAL_RUNS = "final_runs.json"  # per-seed test metrics of the final runs, the reused trial
IMPORTANCE_DIR = "importance"  # appendix E's analysis (also the report's folder of it)
IMPORTANCE_FILE = "importance.json"
IMPORTANCE_PLOT = "importance.png"
