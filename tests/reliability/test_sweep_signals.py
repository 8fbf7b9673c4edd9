"""A stopped sweep resumes to what one uninterrupted run gives: SIGTERM or SIGHUP stops the driver
cleanly, while Ray starts as well (runs closed, Optuna trials failed, its own Ray instance gone
with every process), SIGKILL leaves what `--resume` repairs, and the resumed sweep's table and
chosen configs equal the clean run's."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1800)]


@pytest.fixture(autouse=True)
def temp_dir(monkeypatch):
    """The drivers' TMPDIR (short: Ray's socket paths), where a run stopped or not leaves nothing
    of its own (`left_in`)."""
    folder = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


RAY_OWN = ("ray", "_ray_lockfiles")  # Ray's session logs and its cross-process file locks


def left_in(temp: Path) -> list[str]:
    """What the drivers left in their TMPDIR but Ray's own folders and torch's compile cache:
    multiprocessing's listener folders (`pymp-*`), a Ray instance's temporary folder."""
    return sorted(p.name for p in temp.iterdir()
                  if p.name not in RAY_OWN and not p.name.startswith("torchinductor"))


def _children() -> dict[int, int]:
    """pid -> parent pid of every process (read from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return parents


def _descendants(root: int) -> set[int]:
    parents, found, frontier = _children(), set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def _ray_descendants(root: int) -> set[int]:
    """The descendants of `root` that run Ray's own programs (its GCS server first): a child the
    driver starts and ends before Ray does not count."""
    found = set()
    for pid in _descendants(root):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"/ray/" in command:
            found.add(pid)
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


DATASETS = ("eurosat", "dtd")


def _sweep(storage: Path, weights, *extra):
    """The embedded sweep of two datasets, 2 trials each, one seed, in `storage`. A dataset's
    trials run one after the other in one reused actor: trials side by side, stopped and
    resumed, are tests/reliability/test_concurrent_sweep.py's subject, and each costs an
    actor's start; the two datasets still train at once."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):  # mlflow.set_tracking_uri exports it
        env.pop(name, None)
    storage.mkdir(parents=True, exist_ok=True)
    log = open(storage / f"driver{len(list(storage.glob('driver*.log')))}.log", "w")
    return subprocess.Popen(
        [sys.executable, "sweeps/base2novel.py", "--datasets", ",".join(DATASETS), "--storage",
         str(storage), "--pretrained", str(weights), "--trials", "2", "--seeds", "1",
         "--range", "train.epochs=int:3:5",  # shorter than the profile's 4-8 epochs
         "--concurrent-trials", "1", *extra],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log.name


def _wait_for(driver, log: str, done, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not done():
        assert driver.poll() is None and time.time() < deadline, Path(log).read_text()[-3000:]
        time.sleep(0.2)


def _records(uri: str) -> dict:
    """Every run of the sweep's experiment: status, end time, params, tags."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("vacsr-base2novel")
    return {r.info.run_id: (r.info.status, r.info.end_time, r.data.params, r.data.tags)
            for r in client.search_runs([experiment.experiment_id])}


def _uri(root: Path) -> str:
    return f"sqlite:///{root / 'mlflow.db'}"


def _created(root: Path, dataset: str) -> dict[str, int]:
    """Tune trial id -> its creation index (selection's tie-break order)."""
    import optuna

    from vacsr.sweep.search.selection import creation_order

    storage = optuna.storages.RDBStorage(f"sqlite:///{root / 'optuna.db'}")
    try:
        return creation_order(storage, f"base2novel-{dataset}")
    finally:
        storage.engine.dispose()


def _optuna_states(root: Path, dataset: str, tune_trials: set[str]) -> set[str]:
    """The states of the Optuna trials that configure `tune_trials`."""
    import optuna

    from vacsr.sweep.search.optuna_searcher import TUNE_TRIAL_ATTR

    study = optuna.load_study(study_name=f"base2novel-{dataset}",
                              storage=f"sqlite:///{root / 'optuna.db'}")
    return {t.state.name for t in study.trials if t.user_attrs.get(TUNE_TRIAL_ATTR) in tune_trials}


def _told(root: Path, dataset: str) -> list[str]:
    """The Tune trials whose value the study holds (its COMPLETE trials)."""
    import optuna

    from vacsr.sweep.search.optuna_searcher import TUNE_TRIAL_ATTR

    study = optuna.load_study(study_name=f"base2novel-{dataset}",
                              storage=f"sqlite:///{root / 'optuna.db'}")
    return [t.user_attrs.get(TUNE_TRIAL_ATTR) for t in study.trials if t.state.name == "COMPLETE"]


def _selected(root: Path) -> dict[str, tuple]:
    """Per dataset: the dataset run's params (the chosen config's searched values), its best
    val, and best_config.yaml with the sweep folder's path taken out."""
    from mlflow import MlflowClient

    client = MlflowClient(_uri(root))
    runs = client.search_runs([client.get_experiment_by_name("vacsr-base2novel").experiment_id])
    chosen = {}
    for dataset in DATASETS:
        [run] = [r for r in runs if r.data.tags.get("vacsr.dataset") == dataset]
        best = (root / "best" / dataset / "best_config.yaml").read_text()
        chosen[dataset] = (run.data.params, run.data.metrics["best_val/acc"],
                           best.replace(str(root.parent), "<storage>"))
    return chosen


def _check_selection_agrees(root: Path) -> None:
    """The dataset run's params, best_config.yaml and the selected trial are one config: the
    best val selection saw (each trial run's `selection_val/acc`), ties to the trial the
    searcher created first."""
    import yaml
    from mlflow import MlflowClient

    from vacsr.records import PARAMS_CHANGED_TAG
    from vacsr.sweep.report.table import readable

    client = MlflowClient(_uri(root))
    runs = client.search_runs([client.get_experiment_by_name("vacsr-base2novel").experiment_id])
    for dataset in DATASETS:
        [dataset_run] = [r for r in runs if r.data.tags.get("vacsr.dataset") == dataset]
        assert PARAMS_CHANGED_TAG not in dataset_run.data.tags, dataset_run.data.tags
        best = yaml.safe_load((root / "best" / dataset / "best_config.yaml").read_text())
        searched = dataset_run.data.params  # as read (readable); best_config.yaml is exact
        assert searched and all(readable(best[k.split(".")[0]][k.split(".")[1]]) == v
                                for k, v in searched.items()), (searched, best)
        order = _created(root, dataset)
        trials = {r.info.run_name.removeprefix(f"{dataset}-"): r for r in runs
                  if r.data.tags.get("mlflow.parentRunId") == dataset_run.info.run_id
                  and r.info.run_name.removeprefix(f"{dataset}-") in order}
        # a trial a stop lost before Tune saved it was created again in its place, with its
        # index: the lost one has a KILLED run, or none when the stop came before it started,
        # and the study never took a value from it
        runless = set(order) - set(trials)
        assert all(sum(i == order[t] for i in order.values()) >= 2 for t in runless), order
        assert _optuna_states(root, dataset, runless) <= {"FAIL"}, order
        lost = {t: r for t, r in trials.items() if "selection_val/acc" not in r.data.metrics}
        assert all(r.info.status == "KILLED" for r in lost.values()), lost
        # the trials selection saw are two, created first and second
        trials = {t: r for t, r in trials.items() if t not in lost}
        assert sorted(order[t] for t in trials) == [0, 1], (sorted(trials), order)
        # and the study has each one's value once, a trial a resume continued too
        assert sorted(_told(root, dataset)) == sorted(trials), (_told(root, dataset), order)
        # what selection compared, on each trial's run: Tune's last result (a trial ASHA
        # stopped may log an epoch more before it stops), its run's val/acc at that epoch
        val = {t: r.data.metrics["selection_val/acc"] for t, r in trials.items()}
        for t, r in trials.items():
            epoch = int(r.data.tags["vacsr.selection_epoch"])
            history = {m.step: m.value for m in client.get_metric_history(r.info.run_id,
                                                                           "val/acc")}
            assert history[epoch] == val[t], (t, epoch, history)
        chosen = min(trials, key=lambda t: (-val[t], order[t]))
        assert {k: readable(trials[chosen].data.params[k]) for k in searched} == searched, \
            (val, order)
        assert dataset_run.data.metrics["best_val/acc"] == val[chosen]


def _no_open_records(root: Path) -> None:
    import mlflow
    import optuna

    runs = mlflow.search_runs(experiment_names=["vacsr-base2novel"])
    assert (runs.status == "RUNNING").sum() == 0, runs[["tags.mlflow.runName", "status"]]
    for dataset in DATASETS:
        study = optuna.load_study(study_name=f"base2novel-{dataset}",
                                  storage=f"sqlite:///{root / 'optuna.db'}")
        assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]


def _stopped_cleanly(driver, log: str, signum=signal.SIGTERM, then: str = "runs closed as "
                     "KILLED, continue with --resume") -> None:
    """SIGTERM (or SIGHUP, a closed terminal): exit 128 + its number, one line, no traceback,
    and within 10 s of the exit every process of the driver's Ray instance gone."""
    ray_processes = _descendants(driver.pid)
    assert ray_processes, "the embedded Ray runs under the driver"
    driver.send_signal(signum)
    code = driver.wait(timeout=120)
    ray_processes |= _descendants(driver.pid)  # any it started meanwhile
    output = Path(log).read_text()
    assert code == 128 + signum, output[-3000:]
    assert output.strip().splitlines()[-1] == f"vacsr: stopped by {signum.name}; {then}", \
        output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    deadline = time.time() + 10
    while _alive(ray_processes) and time.time() < deadline:
        time.sleep(0.5)
    assert not _alive(ray_processes), "processes of the driver's Ray instance left running"
    assert left_in(Path(os.environ["TMPDIR"])) == []


def _trial_folders(root: Path) -> set[Path]:
    return {p for d in DATASETS if (root / "trials" / d).is_dir()
            for p in (root / "trials" / d).iterdir() if p.is_dir()}


def test_a_stopped_and_resumed_sweep_gives_the_uninterrupted_table_and_choices(tmp_path,
                                                                               weights,
                                                                               temp_dir):
    """The same sweep command, run once without a stop and once stopped twice, each stop
    followed by --resume: SIGKILL of the driver during a trial, SIGTERM one second after
    the first dataset's last trial (the other dataset still training), then SIGHUP as it
    trains. Both end with the same results.md and the same chosen config for each dataset (the
    dataset run's params, best_config.yaml). On the way: the stopped sweep reuses the costs the
    clean one measured, each --resume those of its folder; a second driver on the folder is
    refused, each stop leaves nothing RUNNING, and a new sweep in the used folder is refused
    with the records unchanged."""
    reference, log = _sweep(tmp_path / "clean", weights)
    assert reference.wait(timeout=900) == 0, Path(log).read_text()[-3000:]
    assert left_in(temp_dir) == []
    clean = tmp_path / "clean" / "base2novel"

    storage = tmp_path / "stopped"
    root = storage / "base2novel"
    driver, log = _sweep(storage, weights)
    _wait_for(driver, log, (root / "sweep_state.json").is_file, timeout=300)  # folder claimed
    second, second_log = _sweep(storage, weights)
    assert second.wait(timeout=180) == 2, Path(second_log).read_text()[-3000:]
    refused = Path(second_log).read_text().strip().splitlines()
    assert refused[-1].startswith("vacsr: error: ") and \
        f"another sweep driver is running in this folder (pid {driver.pid} on" in refused[-1]
    # SIGKILL of the driver while a trial trains: nothing closed, --resume repairs
    _wait_for(driver, log, lambda: bool(_trial_folders(root)), timeout=300)
    time.sleep(2)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=60)
    # a killed worker's temporary checkpoint copy in its run folder: --resume clears it
    left = sorted(_trial_folders(root))[0] / ".scratch-killed"
    left.mkdir()
    (left / "last.ckpt").write_bytes(b"partial")

    # SIGTERM one second after the first dataset's last trial: its search is done, its final
    # phase starting, the other dataset's trial training
    first_log = log
    resumed, log = _sweep(storage, weights, "--resume")
    _wait_for(resumed, log, lambda: any((root / "trials" / d / "selection.json").is_file()
                                        for d in DATASETS))
    assert not left.exists()
    time.sleep(1)
    _stopped_cleanly(resumed, log)
    # the costs the clean sweep measured on this machine, then the sweep folder's own on resume
    assert "costs: reused from the machine cache" in Path(first_log).read_text()
    assert "costs: reused from the sweep folder" in Path(log).read_text()

    import mlflow

    mlflow.set_tracking_uri(_uri(root))
    runs = mlflow.search_runs(experiment_names=["vacsr-base2novel"])
    assert "KILLED" in set(runs.status)
    _no_open_records(root)

    # SIGHUP (the terminal closed) while the other dataset trains: a stop like SIGTERM
    resumed, log = _sweep(storage, weights, "--resume")
    _wait_for(resumed, log, lambda: "dataset(s) to search" in Path(log).read_text())
    time.sleep(3)
    _stopped_cleanly(resumed, log, signal.SIGHUP)
    _no_open_records(root)

    resumed, log = _sweep(storage, weights, "--resume")
    assert resumed.wait(timeout=900) == 0, Path(log).read_text()[-3000:]
    _no_open_records(root)
    assert left_in(temp_dir) == []  # the SIGKILLed driver's folder too, gone with its instance
    runs = mlflow.search_runs(experiment_names=["vacsr-base2novel"])
    parents = runs[runs["tags.vacsr.kind"] == "base2novel"]
    assert len(parents) == 1 and parents.status.iloc[0] == "FINISHED"
    assert parents["tags.vacsr.costs_from"].iloc[0] == "sweep folder"  # the last start's
    assert (root / "report" / "results.md").read_text() == \
        (clean / "report" / "results.md").read_text()
    assert _selected(root) == _selected(clean)
    _check_selection_agrees(root)
    _check_selection_agrees(clean)

    before = _records(_uri(root))
    again, log = _sweep(storage, weights)  # a new sweep, no --resume, in the used folder
    assert again.wait(timeout=180) == 2, Path(log).read_text()[-3000:]
    assert "holds the sweep 'base2novel' already" in Path(log).read_text()
    assert _records(_uri(root)) == before  # the earlier sweep's MLflow runs are unchanged


def test_a_stop_while_ray_starts_is_one_line_and_ray_goes(tmp_path, weights):
    """ray.init sets a SIGTERM handler of its own, which exited with status 15 and no word: the
    sweep's handler wins during the start as well, and what Ray had started goes."""
    driver, log = _sweep(tmp_path, weights)
    deadline = time.time() + 300
    while not _ray_descendants(driver.pid):  # Ray's first process: ray.init is running
        assert driver.poll() is None and time.time() < deadline, Path(log).read_text()[-3000:]
        time.sleep(0.02)
    assert "dataset(s) to search" not in Path(log).read_text()
    _stopped_cleanly(driver, log, then="while Ray started, before any run, continue with "
                                       "--resume")
    assert (tmp_path / "base2novel" / "sweep_state.json").is_file()  # what --resume continues
