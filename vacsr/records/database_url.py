"""A database URL as users write it (`postgresql://user:password@host:5432/mlflow`,
docs/cluster.md), with a driver SQLAlchemy can import. MLflow's SQL store and Optuna's RDB storage
both hand the URL to SQLAlchemy, whose default driver for `postgresql://` is psycopg2; vacsr's
`cluster` extra installs psycopg 3 instead, so a URL that names no driver gets `+psycopg` unless
psycopg2 is installed. `postgres://` (the spelling of some hosted services, which SQLAlchemy 2
refuses) is read as `postgresql://`. Every other URL, and one that names its driver, is kept as
written; the credentials are never touched (they are the database's login)."""
from __future__ import annotations

from functools import lru_cache
from importlib.util import find_spec

POSTGRES_SCHEMES = ("postgresql", "postgres")


@lru_cache(maxsize=1)
def _postgres_scheme() -> str:
    """SQLAlchemy's scheme for the installed driver: psycopg2 is its default, psycopg 3 is named;
    with neither, the default, whose import error SQLAlchemy then reports. Looked up once per
    process (every tracker a process opens asks)."""
    if find_spec("psycopg2") is None and find_spec("psycopg") is not None:
        return "postgresql+psycopg"
    return "postgresql"


def with_driver(url: str) -> str:
    """`url` with the PostgreSQL driver SQLAlchemy can import; anything else unchanged."""
    scheme, separator, rest = url.partition("://")
    if not separator or scheme.lower() not in POSTGRES_SCHEMES:
        return url
    return f"{_postgres_scheme()}://{rest}"
