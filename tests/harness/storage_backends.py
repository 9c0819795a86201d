"""Storage URLs for the storage tests: ``db_url`` names every backend (the in-memory store, a
SQLite file in tmp_path, and a fresh PostgreSQL database per test on the local server, skipped
when none answers); ``sql_url`` only the SQL ones, for tests of SQL itself."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_USERS = ("postgres", "root")


def _admin_connection() -> object | None:
    try:
        import psycopg
    except ImportError:
        return None
    for user in PG_USERS:
        try:
            return psycopg.connect(
                host=PG_HOST,
                port=PG_PORT,
                user=user,
                dbname="test",
                autocommit=True,
                connect_timeout=3,
            )
        except Exception:
            continue
    return None


@pytest.fixture(params=["memory", "sqlite", "postgresql"], name="db_url")
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL for an empty store, for ``open_storage``: ``memory://``, SQLite in tmp_path, or a
    throwaway PostgreSQL database (``hermes_test_<random>``, dropped afterwards, so parallel
    runs never collide). The same tests pass on each: that is the ``Storage`` contract."""
    yield from _url(request.param, tmp_path)


@pytest.fixture(params=["sqlite", "postgresql"], name="sql_url")
def sql_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL for an empty SQL database (SQLite or PostgreSQL), for tests of the SQL backend."""
    yield from _url(request.param, tmp_path)


def _url(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "memory":
        yield "memory://"
        return
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'state.db'}"
        return
    admin = _admin_connection()
    if admin is None:
        pytest.skip(f"no PostgreSQL server at {PG_HOST}:{PG_PORT}")
    name = f"hermes_test_{uuid.uuid4().hex[:12]}"
    user = admin.info.user  # type: ignore[attr-defined]
    admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[attr-defined]
    try:
        yield f"postgresql+psycopg://{user}@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[attr-defined]
        admin.close()  # type: ignore[attr-defined]


def sqlite_url(tmp_path: Path) -> str:
    """The URL of a SQLite file, ``state.db`` in ``tmp_path``."""
    return f"sqlite:///{tmp_path / 'state.db'}"
