"""Records that several processes write at once: a store's write that lost a race is made again.

MLflow's SQL store creates a shared record by looking it up and inserting it when absent: the
dataset behind a run's dataset inputs (one per experiment, name and digest), an experiment tag (a
saved view, the experiment's kind), a run tag. The method units of one dataset, a cluster's nodes
and an MLflow server's clients write the same such records at the same moment, and then both
writers find the record absent and the second insert breaks the table's unique constraint
(`UNIQUE constraint failed: datasets.experiment_id, datasets.name, datasets.digest`). The store
rolls that write back whole, and the record it collided with is committed by then, so the same
call made again finds it and completes: what it leaves is what the two writers would have left
one after the other. `retry_conflicts` is that one rule, applied to every MLflow client call of
vacsr (records/client.py), in this process or through a tracking server, whose answer carries
the database's own words.

A conflict that names a record the caller asked to create (`create_experiment` of a name that
exists: RESOURCE_ALREADY_EXISTS) is an answer, not a lost race, and goes back to the caller.

Opening a new store creates its tables: two processes doing it at once (two sweeps on one new
study database, the first clients of a new MLflow database) find the tables absent and the
second `CREATE TABLE` fails (`table studies already exists`). `retry_store_creation` makes that
opening again, when the tables are there. SQLite stores are also opened under a lock
(records/uri.py, store_creation_lock), which keeps their migrations apart.
"""
from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# How each database words a broken unique constraint (SQLite, PostgreSQL through psycopg,
# MySQL, SQL Server): in the exception in this process, in a tracking server's error text.
UNIQUE_CONFLICT = re.compile(
    r"UNIQUE constraint failed|duplicate key value violates unique constraint|UniqueViolation"
    r"|Duplicate entry .* for key|Violation of (?:UNIQUE KEY|PRIMARY KEY) constraint"
    r"|Cannot insert duplicate key", re.IGNORECASE)
# a table (or an index, a type) that another process created a moment before
SCHEMA_CONFLICT = re.compile(r"(?:table|relation|index|type) \S+ already exists", re.IGNORECASE)
ANSWERS = {"RESOURCE_ALREADY_EXISTS"}  # error codes that say what exists, for the caller
# Each try waits a random share of its bound (so that the writers of one race do not meet
# again), the bound doubling: at most about 3 s in all, far beyond one commit of another writer.
ATTEMPTS = 6
FIRST_WAIT_S = 0.1
# its own generator: a draw from `random`'s shared one would shift a seeded run's later draws
_JITTER = random.Random()


def is_unique_conflict(exc: BaseException) -> bool:
    """True when `exc` (or an exception it was raised from) is a unique-constraint violation
    of a store, and not an answer meant for the caller."""
    if getattr(exc, "error_code", None) in ANSWERS:
        return False
    return any(UNIQUE_CONFLICT.search(str(e)) for e in _chain(exc))


def is_schema_conflict(exc: BaseException) -> bool:
    """True when `exc` says a store's table was being created by another process too."""
    return is_unique_conflict(exc) or any(SCHEMA_CONFLICT.search(str(e)) for e in _chain(exc))


def _chain(exc: BaseException | None):
    """`exc` and the exceptions it was raised from, each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def retry_conflicts(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`call(*args, **kwargs)`, made again after a unique-constraint conflict (ATTEMPTS tries in
    all); the last conflict, or any other error, is raised as it came."""
    return _retried(call, args, kwargs, is_unique_conflict)


def retry_store_creation(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`call(*args, **kwargs)`, a store's opening, made again when another process was creating
    the same tables at that moment."""
    return _retried(call, args, kwargs, is_schema_conflict)


def _retried(call: Callable[..., T], args: tuple, kwargs: dict,
             conflict: Callable[[BaseException], bool]) -> T:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            if attempt == ATTEMPTS or not conflict(exc):
                raise
            log.debug("%s met a concurrent write (%s); try %d of %d",
                      getattr(call, "__name__", call), str(exc).splitlines()[0][:120],
                      attempt + 1, ATTEMPTS)
            time.sleep(_JITTER.uniform(0.2, 1.0) * FIRST_WAIT_S * 2 ** (attempt - 1))
    raise AssertionError("unreachable")  # the loop returns or raises
