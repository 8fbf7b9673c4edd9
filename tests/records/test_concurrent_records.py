"""Records that several processes write at the same moment: 8 writers released together by a
barrier, round after round, each writing what the method units of one dataset write (the
experiment, the dataset's inputs, the saved view, a tag on a run they share), and every record
is there once. The race is made to happen, not left to luck: without vacsr/records/conflicts.py
most rounds lose a write to `UNIQUE constraint failed`.
"""
from __future__ import annotations

import multiprocessing
import sqlite3
import uuid
from types import SimpleNamespace

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WRITERS, ROUNDS = 8, 8
SPLITS = ("train", "val", "test")
VIEW_KEY, SHARED_TAG = "vacsr-race", "vacsr.race"


def _prints():
    from vacsr.data.digest import SplitFingerprint

    return [SplitFingerprint(split, "/data/eurosat/2750", f"{split}-0123456789ab", 10, 5)
            for split in SPLITS]


def _write_unit(uri: str, experiment: str, shared_run: str, writer: int) -> None:
    """What one unit of a dataset writes that its siblings write too."""
    from vacsr.records.inputs import dataset_inputs
    from vacsr.records.tracker import open_tracker
    from vacsr.records.view import save_view

    tracker = open_tracker(uri)
    run_id = tracker.start(experiment, f"eurosat.method{writer}")
    tracker.client.log_inputs(run_id, datasets=dataset_inputs("eurosat", _prints()))
    save_view(tracker.client, tracker.experiment_id(experiment), VIEW_KEY, "race", {"w": writer})
    if shared_run is not None:
        tracker.client.set_tag(shared_run, SHARED_TAG, "written")
    tracker.finish()


def _writer(write, jobs, barrier, index, answers) -> None:
    """Each job written at the barrier's release; the failures go back as lines."""
    failures = []
    for job in jobs:
        barrier.wait(timeout=120)
        try:
            write(*job, index)
        except Exception as exc:  # the test reports every one
            failures.append(f"{job} writer {index}: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:160]}")
    answers.put(failures)


def _race(write, jobs: list[tuple]) -> list[str]:
    """`write(*job, writer)` by WRITERS processes at once, job after job; the failures."""
    context = multiprocessing.get_context("fork")  # the imports above are shared, not repeated
    barrier, answers = context.Barrier(WRITERS), context.Queue()
    writers = [context.Process(target=_writer, args=(write, jobs, barrier, i, answers))
               for i in range(WRITERS)]
    for process in writers:
        process.start()
    try:
        failures = [line for _ in writers for line in answers.get(timeout=240)]
    finally:
        for process in writers:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    return failures


def _mlflow_race(uri: str, db) -> None:
    """ROUNDS rounds against the store at `uri` (its database file `db`), then the checks."""
    from vacsr.records.tracker import open_tracker
    from vacsr.records.view import VIEW_TAG_PREFIX

    tracker = open_tracker(uri)
    prefix = uuid.uuid4().hex[:8]
    experiments = [f"race-{prefix}-{r}" for r in range(ROUNDS)]
    jobs = [(name, tracker.client.create_run(tracker.experiment_id(name)).info.run_id)
            for name in experiments[::2]]  # half the experiments exist before their round
    jobs += [(name, None) for name in experiments[1::2]]
    failures = _race(_write_unit, [(uri, *job) for job in jobs])
    assert failures == [], f"{len(failures)} failed writes, e.g. {failures[:3]}"

    with sqlite3.connect(db) as store:
        for experiment, shared_run in jobs:
            (experiment_id,), = store.execute(
                "select experiment_id from experiments where name = ?", (experiment,))
            datasets = store.execute("select name, digest from datasets where experiment_id = ?",
                                     (experiment_id,)).fetchall()
            assert sorted(datasets) == sorted(("eurosat", p.digest) for p in _prints())
            runs = store.execute("select run_uuid from runs where experiment_id = ? and "
                                 "name like 'eurosat.method%'", (experiment_id,)).fetchall()
            assert len(runs) == WRITERS
            for (run_id,) in runs:  # each unit's run has its three splits, once each
                inputs = store.execute("select count(*) from inputs where destination_id = ?",
                                       (run_id,)).fetchone()
                assert inputs == (len(SPLITS),)
            views = store.execute("select count(*) from experiment_tags where experiment_id = ? "
                                  "and key = ?", (experiment_id, VIEW_TAG_PREFIX + VIEW_KEY))
            assert views.fetchone() == (1,)
            if shared_run is not None:
                tags = store.execute("select value from tags where run_uuid = ? and key = ?",
                                     (shared_run, SHARED_TAG)).fetchall()
                assert tags == [("written",)]


def test_units_writing_one_datasets_records_at_once_on_sqlite(tmp_path):
    db = tmp_path / "mlflow.db"
    _mlflow_race(f"sqlite:///{db}", db)


def test_units_writing_one_datasets_records_at_once_through_a_server(tmp_path, servers):
    db = tmp_path / "server.db"
    url, _ = servers.mlflow(f"sqlite:///{db}")
    _mlflow_race(url, db)


def _open_study(url: str, study: str, writer: int) -> None:
    """What a unit's search does first: open the study database, create or load its study."""
    import optuna

    from vacsr.sweep.plan.studies import open_optuna_storage

    storage = open_optuna_storage(SimpleNamespace(optuna_storage_url=url))
    created = optuna.create_study(storage=storage, study_name=study, load_if_exists=True)
    created.tell(created.ask(), float(writer))
    storage.engine.dispose()


def test_sweeps_opening_one_new_study_database_at_once(tmp_path):
    """Two sweeps (or units) opening one new study database: its tables are created once and
    the study with them; every trial is in it."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    jobs = [(f"sqlite:///{tmp_path / f'optuna-{r}.db'}", "base2novel-eurosat")
            for r in range(ROUNDS // 2)]
    failures = _race(_open_study, jobs)
    assert failures == [], f"{len(failures)} failed opens, e.g. {failures[:3]}"
    for url, study in jobs:
        trials = optuna.load_study(study_name=study, storage=url).trials
        assert sorted(t.value for t in trials) == list(range(WRITERS))
