"""Where a sweep keeps things, the one place that spells it: its folder (state, reports, best
configs, data, the Optuna study, the lock), and Ray's storage (Tune/Train experiments and
checkpoints: the sweep folder, or --ray-storage as a local path or an s3:// gs:// file:// URI).

    <sweep folder>/                   sweep_folder(--storage, --name)
      sweep_state.json                state_file: what is done (vacsr/records/sweep_state.py)
      optuna.db                       optuna_url: the studies, unless --optuna-storage
      mlflow.db                       the runs, unless --tracking-uri (vacsr/records/uri.py)
      driver.lock, .space-reserve     the running driver's lock and room to close its records
      trials/<dataset>/               trial_folder: the trials' run folders, selection.json,
                                      asha_rungs.json
      final/<dataset>/seed<N>/        final_run_folder: the final seed runs
      best/<dataset>/                 best_folder: best_config.yaml
      report/                         report_folder: results.md .csv .png, per_seed.csv,
                                      importance/<dataset>/ (importance_folder), and with
                                      --methods comparison.md .csv, comparison_differences.csv
      errors/<dataset>.txt            error_file: a failed dataset's traceback
      costs.json                      costs_file: the plan's measured step costs, with their key
                                      (vacsr/sweep/cost/cost_store.py; --resume reads them)
      prefix_cache/<dataset>/         prefix_cache_folder: frozen-prefix outputs
      data/, tiny-clip.pt             the embedded profile's synthetic data and weights
    <Ray storage>/tune/<dataset>/, trials/, final/   Tune's experiments, Ray Train's runs
"""
from __future__ import annotations

import os
from pathlib import Path

from vacsr.atomic import atomic_write
from vacsr.records.artifacts import IMPORTANCE_DIR

TRIALS, FINAL, TUNE = "trials", "final", "tune"  # in the sweep folder and in Ray's storage
STATE_FILE = "sweep_state.json"
OPTUNA_DB = "optuna.db"
LOCK_FILE = "driver.lock"
RESERVE_FILE = ".space-reserve"
COSTS_FILE = "costs.json"
SELECTION_FILE = "selection.json"  # in a trial folder
ASHA_RUNGS_FILE = "asha_rungs.json"  # in a trial folder
RESULTS_MD, RESULTS_CSV, PER_SEED_CSV, RESULTS_PNG = (
    "results.md", "results.csv", "per_seed.csv", "results.png")  # in the report folder
COMPARISON_MD, COMPARISON_CSV, COMPARISON_DIFFERENCES_CSV = (
    "comparison.md", "comparison.csv", "comparison_differences.csv")  # in the report folder


def sweep_folder(root: str | os.PathLike, name: str) -> Path:
    return Path(root).expanduser().resolve() / name


def state_file(storage: Path) -> Path:
    return Path(storage) / STATE_FILE


def optuna_url(storage: Path) -> str:
    """The default Optuna storage: a SQLite file in the sweep folder."""
    return f"sqlite:///{Path(storage) / OPTUNA_DB}"


def costs_file(storage: Path) -> Path:
    return Path(storage) / COSTS_FILE


def trial_folder(storage: Path, dataset: str) -> Path:
    return Path(storage) / TRIALS / dataset


def tune_experiment(dataset: str, dataset_run_id: str) -> str:
    """The name of the dataset's Tune experiment, its folder under the sweep's tune/: the
    dataset and its MLflow run's id, which no other sweep has. Ray stages an experiment's files
    on its node in <Ray session>/artifacts/<the second its Tuner was made>/<name>: two sweeps on
    one cluster whose Tuners of one name were made in one second would each write, and resume
    from, the other's experiment state."""
    return f"{dataset}-{dataset_run_id[:12]}"


def asha_rungs_file(storage: Path, dataset: str) -> Path:
    """ASHA's rungs, decisions and stops of the dataset's search (vacsr/sweep/search/rungs.py)."""
    return trial_folder(storage, dataset) / ASHA_RUNGS_FILE


def final_run_folder(storage: Path, dataset: str, seed: int) -> Path:
    return Path(storage) / FINAL / dataset / f"seed{seed}"


def run_folders(storage: Path) -> tuple[Path, Path]:
    """The folders that hold training runs: the trials' and the final seed runs'."""
    return Path(storage) / TRIALS, Path(storage) / FINAL


def best_folder(storage: Path, dataset: str) -> Path:
    return Path(storage) / "best" / dataset


def report_folder(storage: Path) -> Path:
    return Path(storage) / "report"


def importance_folder(storage: Path, dataset: str) -> Path:
    """Appendix E's analysis of one dataset, under the report folder (the same name as its
    artifact folder on the dataset's MLflow run)."""
    return report_folder(storage) / IMPORTANCE_DIR / dataset


def error_file(storage: Path, dataset: str) -> Path:
    return Path(storage) / "errors" / f"{dataset}.txt"


def prefix_cache_folder(storage: Path, dataset: str) -> Path:
    """Where a dataset's runs keep their evaluation passes' frozen-prefix outputs
    (data.prefix_cache_dir): every trial and final seed of the dataset on a node that sees the
    sweep folder shares it."""
    return Path(storage) / "prefix_cache" / dataset


def embedded_data(storage: Path) -> Path:
    """The embedded profile's synthetic datasets, in their real layouts."""
    return Path(storage) / "data"


def embedded_weights(storage: Path) -> Path:
    """The embedded profile's pretrained tiny CLIP."""
    return Path(storage) / "tiny-clip.pt"


def join_storage(root: str, *parts: str) -> str:
    """`root`/parts for a local path or a URI (s3://, gs://, file://): pyarrow takes both."""
    if "://" in root:
        return "/".join([root.rstrip("/"), *parts])
    return str(Path(root, *parts))


def storage_filesystem(root: str):
    """The pyarrow filesystem `root` (a local path or an s3:// gs:// file:// URI) lives on."""
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(root)[0] if "://" in root else pafs.LocalFileSystem()


def copy_from_storage(root: str, path: str, dest: Path) -> Path:
    """Copy `path` (a file on the storage `root` lives on, as Ray Train reports it) to `dest`."""
    import pyarrow.fs as pafs

    def copy(tmp: Path) -> None:
        pafs.copy_files(path, str(tmp), source_filesystem=storage_filesystem(root),
                        destination_filesystem=pafs.LocalFileSystem())

    return atomic_write(dest, copy)
