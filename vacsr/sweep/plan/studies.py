"""The sweep's Optuna study database (`--optuna-storage`, default SQLite in the sweep folder):
opened by the plan's check, the folder's owner, the driver, the search and the sensitivity
analysis. optuna is imported only when one is opened, so the flags and their refusals stay light.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from vacsr.errors import ConfigError
from vacsr.redact import redact_uri

if TYPE_CHECKING:
    from vacsr.sweep.plan.plan import SweepPlan


def open_optuna_storage(plan: SweepPlan):
    """The study database (RDB storage); ConfigError naming it when it cannot be opened."""
    import optuna

    url = plan.optuna_storage_url
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as exc:  # SQLAlchemy/driver errors: name the storage, stop early
        raise ConfigError(f"--optuna-storage {redact_uri(url)}: cannot open "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from None


def check_optuna_storage(plan: SweepPlan) -> None:
    """Open and close the study database: an unreachable one fails before any trial."""
    open_optuna_storage(plan).engine.dispose()
