"""Sweeps: Ray Tune + Optuna searches of Ray Train runs (paper sec. 4.1, appendix C), recorded in
MLflow through vacsr.records. The sub-packages follow a sweep's flow:

- `spec/`: what a sweep is, as data: `SweepKind` (kind.py), the paper's ranges and published
  numbers (paper.py), search spaces (space.py), ASHA's schedule (schedule.py). sweeps/*.py
  declare their kinds with these.
- `plan/`: the flags to a checked `SweepPlan` before Ray starts (flags.py, the parser;
  command_line.py, the flags to a plan; inputs.py, plan.py; embedded_profile.py and
  embedded.yaml), the sweep folder's layout, spelled only in folders.py, and who owns it
  (ownership.py).
- `cost/`: what a sweep will cost before it runs (`--plan`): counts, calibration, the estimate,
  the memory check (sweep_cost.py composes them).
- `search/`: one dataset's Tune + Optuna search (tune.py), the Optuna searcher
  (optuna_searcher.py), ASHA with its recorded stops (asha.py), which trial wins (selection.py),
  the trial itself (trial.py, trial_run.py), recovery from a full disk or a tracking outage
  (recovery.py) and the resume's check of the search's files (resume_files.py).
- `final/`: the selected config re-run on every seed, then its test evaluations (seeds.py).
- `report/`: the final table (table.py), `vacsr best` (best.py), the sensitivity analysis
  (importance.py) and the console progress (progress.py).
- `flow/`: the driver (driver.py: datasets -> search -> final runs -> table), a dataset's Ray
  task (dataset_task.py) and the progress events of the dataset tasks (events.py).

`cli.py` is the one entry: `main(kind)` of the sweep scripts. Each sub-package imports only the
ones listed before it (docs/architecture.md).
"""
