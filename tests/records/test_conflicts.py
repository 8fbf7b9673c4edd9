"""The one rule for a write that lost a race (vacsr/records/conflicts.py): made again after a
unique-constraint conflict, never after an answer meant for the caller or another error."""
from __future__ import annotations

import random

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS

from vacsr.records import conflicts
from vacsr.records.conflicts import is_schema_conflict, is_unique_conflict, retry_conflicts


@pytest.fixture(autouse=True)
def _no_waits(monkeypatch):
    monkeypatch.setattr(conflicts, "FIRST_WAIT_S", 0.0)


def _failing(times: int, exc: Exception):
    calls = []

    def call(value):
        calls.append(value)
        if len(calls) <= times:
            raise exc
        return value
    return call, calls


@pytest.mark.parametrize("words", [
    "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, datasets.name",
    "BAD_REQUEST: (psycopg.errors.UniqueViolation) duplicate key value violates unique "
    "constraint \"datasets_pk\"",
    "(pymysql.err.IntegrityError) (1062, \"Duplicate entry 'x' for key 'PRIMARY'\")"])
def test_a_lost_race_is_written_again(words):
    call, calls = _failing(2, MlflowException(words))
    assert retry_conflicts(call, "v") == "v" and calls == ["v"] * 3


def test_a_conflict_raised_from_the_driver_is_one_too():
    try:
        try:
            raise RuntimeError("UNIQUE constraint failed: experiment_tags.key")
        except RuntimeError as inner:
            raise MlflowException("write failed") from inner
    except MlflowException as outer:
        assert is_unique_conflict(outer)


def test_an_answer_or_another_error_goes_back_at_once():
    exists = MlflowException("Experiment(name=x) already exists. Error: UNIQUE constraint "
                             "failed: experiments.name", error_code=RESOURCE_ALREADY_EXISTS)
    for exc in (exists, MlflowException("NOT NULL constraint failed: runs.name"), OSError("x")):
        call, calls = _failing(1, exc)
        with pytest.raises(type(exc)):
            retry_conflicts(call, "v")
        assert calls == ["v"]


def test_a_conflict_that_lasts_is_raised_after_the_last_try():
    call, calls = _failing(100, MlflowException("UNIQUE constraint failed: datasets.name"))
    with pytest.raises(MlflowException, match="UNIQUE"):
        retry_conflicts(call, "v")
    assert len(calls) == conflicts.ATTEMPTS


def test_tables_created_by_another_opener_are_a_schema_conflict_only():
    for words in ("(sqlite3.OperationalError) table studies already exists",
                  'relation "studies" already exists'):
        assert is_schema_conflict(Exception(words)) and not is_unique_conflict(Exception(words))


def test_the_waits_leave_a_seeded_runs_draws_alone(monkeypatch):
    monkeypatch.setattr(conflicts, "FIRST_WAIT_S", 1e-6)
    random.seed(7)
    expected = [random.random() for _ in range(3)]
    random.seed(7)
    call, _ = _failing(3, MlflowException("UNIQUE constraint failed: datasets.name"))
    retry_conflicts(call, "v")
    assert [random.random() for _ in range(3)] == expected
