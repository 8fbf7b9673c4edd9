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


def _jobs(uri: str) -> list[tuple]:
    """A round per experiment: (its name, the run its writers all tag, or None); half the
    experiments and their shared runs exist before their round."""
    from vacsr.records.tracker import open_tracker

    tracker = open_tracker(uri)
    prefix = uuid.uuid4().hex[:8]
    experiments = [f"race-{prefix}-{r}" for r in range(ROUNDS)]
    jobs = [(name, tracker.client.create_run(tracker.experiment_id(name)).info.run_id)
            for name in experiments[::2]]
    return jobs + [(name, None) for name in experiments[1::2]]


def _in_a_process(function, *args):
    """`function(*args)` in a forked process: this one opens no store the writers, forked after
    it, would inherit (a connection to a database server is not to be shared across a fork;
    a sweep's units are processes Ray starts afresh)."""
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    process = context.Process(target=lambda: answers.put(function(*args)))
    process.start()
    try:
        return answers.get(timeout=120)
    finally:
        process.join(timeout=30)


def _mlflow_race(uri: str, connect, mark: str = "?") -> None:
    """ROUNDS rounds against the store at `uri`, then the checks, read through `connect()` (a
    DB-API connection to the store's database, whose parameter mark is `mark`)."""
    from vacsr.records.view import VIEW_TAG_PREFIX

    jobs = _in_a_process(_jobs, uri)
    failures = _race(_write_unit, [(uri, *job) for job in jobs])
    assert failures == [], f"{len(failures)} failed writes, e.g. {failures[:3]}"

    with connect() as connection:
        def store_execute(sql: str, params: tuple):
            return connection.execute(sql.replace("?", mark), params)

        store = SimpleNamespace(execute=store_execute)
        for experiment, shared_run in jobs:
            (experiment_id,), = store.execute(
                "select experiment_id from experiments where name = ?", (experiment,))
            datasets = store.execute("select name, digest from datasets where experiment_id = ?",
                                     (experiment_id,)).fetchall()
            assert sorted(datasets) == sorted(("eurosat", p.digest) for p in _prints())
            runs = store.execute("select run_uuid from runs where experiment_id = ? and "
                                 "name like ?", (experiment_id, "eurosat.method%")).fetchall()
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
    _mlflow_race(f"sqlite:///{db}", lambda: sqlite3.connect(db))


def test_units_writing_one_datasets_records_at_once_through_a_server(tmp_path, servers):
    db = tmp_path / "server.db"
    url, _ = servers.mlflow(f"sqlite:///{db}")
    _mlflow_race(url, lambda: sqlite3.connect(db))


def test_units_writing_one_datasets_records_at_once_on_postgresql(servers):
    """The tracking URI straight to a PostgreSQL database (tests/support/postgres.py), as users
    write it: its unique constraints break in PostgreSQL's words."""
    import psycopg

    from tests.support.postgres import PASSWORD, create_database, start_postgresql

    url = create_database(start_postgresql(servers), "mlflow")
    _mlflow_race(url, lambda: psycopg.connect(url, password=PASSWORD), "%s")


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
