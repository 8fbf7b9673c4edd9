"""The sweep's Optuna study database (`--optuna-storage`, default SQLite in the sweep folder):
opened by the plan's check, the folder's owner, the driver, the search and the sensitivity
analysis, and by two sweeps on one new database at once too (records/conflicts.py); and the
name of each unit's study in it (`study_name`). optuna is imported only when one is opened, so
the flags and their refusals stay light.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from vacsr.errors import ConfigError
from vacsr.redact import redact_uri

if TYPE_CHECKING:
    from vacsr.sweep.plan.plan import SweepPlan


def study_name(sweep: str, unit: str) -> str:
    """A unit's study: `<sweep>-<unit>`. The sweep's name is its kind's unless --name gives
    another, and a unit is its dataset in a sweep of one method (`base2novel-eurosat`, the name
    a resume looks for) or `<dataset>.<method>` in a comparison (`base2novel-eurosat.coop`), so
    optuna-dashboard lists a comparison's studies as kind, dataset and method."""
    return f"{sweep}-{unit}"


# The study databases this process opened, by their URL as shown (password masked): a searcher
# unpickled here (vacsr/sweep/search/optuna_searcher.py) holds that form alone
_OPENED: dict[str, object] = {}


def remember_storage(storage) -> None:
    """`storage` is the one a searcher unpickled in this process takes for its URL."""
    _OPENED[redact_uri(storage.url)] = storage


def opened_storage(shown_url: str):
    """The storage this process opened whose URL shows as `shown_url`; ConfigError when none."""
    if shown_url not in _OPENED:
        raise ConfigError(f"--optuna-storage {shown_url}: the sweep's saved search names this "
                          "study database, which this sweep does not use; resume with the "
                          "--optuna-storage the sweep started with")
    return _OPENED[shown_url]


def open_optuna_storage(plan: SweepPlan):
    """The study database (RDB storage); ConfigError naming it when it cannot be opened."""
    import optuna

    from vacsr.records.conflicts import retry_store_creation
    from vacsr.records.database_url import with_driver
    from vacsr.records.uri import store_creation_lock

    url = with_driver(plan.optuna_storage_url)
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    try:  # a new database's tables are created here: once, whoever else opens it now
        with store_creation_lock(url):
            storage = retry_store_creation(optuna.storages.RDBStorage, url, engine_kwargs=kwargs)
        remember_storage(storage)
        return storage
    except Exception as exc:  # SQLAlchemy/driver errors: name the storage, stop early
        raise ConfigError(f"--optuna-storage {redact_uri(url)}: cannot open "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from None


def check_optuna_storage(plan: SweepPlan) -> None:
    """Open and close the study database: an unreachable one fails before any trial."""
    open_optuna_storage(plan).engine.dispose()


def fail_running_trials(storage, study_name: str) -> int:
    """Optuna trials left RUNNING or WAITING (their driver was killed) marked FAIL; returns how
    many. None waits afterwards: the searcher's next ask takes the trial it enqueues itself."""
    from optuna.trial import TrialState

    try:
        study_id = storage.get_study_id_from_name(study_name)
    except KeyError:
        return 0
    stale = storage.get_all_trials(study_id, deepcopy=False,
                                   states=(TrialState.RUNNING, TrialState.WAITING))
    for trial in stale:
        storage.set_trial_state_values(
            storage.get_trial_id_from_study_id_trial_number(study_id, trial.number),
            TrialState.FAIL)
    return len(stale)
