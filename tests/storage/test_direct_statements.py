"""Statements sent straight on psycopg's connection (``storage.driver``), against the local
PostgreSQL server: each commits on its own; the pooled connection goes back as SQLAlchemy
leaves it (a transaction after it is still one transaction); a driver error comes back as the
SQLAlchemy error ``Connection.execute`` raises, and a connection the server dropped is thrown
away, so the next statement gets a working one (and one that went while pooled is never
used); a Core statement's own values travel with it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc
from sqlalchemy import bindparam, insert, select, text, update

from hermes_agent.errors import is_store_error
from hermes_agent.storage import SqlStorage
from hermes_agent.storage.schema import sessions_table
from hermes_agent.worker.attempt import transient
from storage_backends import _admin_connection, _url


@pytest.fixture(name="storage")
def pg_storage(tmp_path: Path) -> Iterator[SqlStorage]:
    """A ``SqlStorage`` on a throwaway PostgreSQL database (skipped when none answers)."""
    for url in _url("postgresql", tmp_path):
        storage = SqlStorage(url)
        try:
            yield storage
        finally:
            storage.close()


def count_sessions(storage: SqlStorage) -> int:
    with storage.transaction() as conn:
        return int(conn.execute(text("SELECT count(*) FROM sessions")).scalar_one())


def add_session(session_id: str) -> tuple[Any, dict[str, Any]]:
    statement = text(
        "INSERT INTO sessions (id, created_ns, updated_ns, turns, messages) "
        "VALUES (:p_id, 1, 1, 0, 0) RETURNING id"
    )
    return statement, {"p_id": session_id}


def test_a_statement_at_once_writes_on_sqlite_too(tmp_path: Path) -> None:
    storage = SqlStorage(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        statement, params = add_session("s")
        assert storage.write_at_once(statement, params).id == "s"
        assert count_sessions(storage) == 1
    finally:
        storage.close()


def test_a_statement_commits_on_its_own_and_leaves_the_connection_as_it_found_it(
    storage: SqlStorage,
) -> None:
    statement, params = add_session("one")
    row = storage.write_at_once(statement, params)
    assert row is not None and row.id == "one"
    assert count_sessions(storage) == 1  # committed: another connection sees it
    # The connection went back to the pool out of autocommit: a transaction that fails
    # after a write undoes that write.
    with pytest.raises(RuntimeError), storage.transaction(write=True) as conn:
        assert conn.connection.dbapi_connection.autocommit is False  # type: ignore[union-attr]
        conn.execute(insert(sessions_table).values(id="two", created_ns=1, updated_ns=1))
        raise RuntimeError("undo it")
    assert count_sessions(storage) == 1
    # A statement that returns no row, and one whose row holds nothing.
    assert storage.write_at_once(text("SELECT 1 AS one WHERE false"), {}) is None
    assert storage.write_at_once(text("UPDATE sessions SET updated_ns = 2"), {}) is None


def test_a_core_statement_sends_its_own_values_with_the_callers(storage: SqlStorage) -> None:
    s = sessions_table.c
    statement = (
        update(sessions_table)
        .where(s.id == bindparam("p_id"), s.messages == 0)  # 0: its own value
        .values(messages=s.messages + 5, updated_ns=bindparam("p_now"))
        .returning(s.messages, s.updated_ns)
    )
    storage.write_at_once(*add_session("core"))
    row = storage.write_at_once(statement, {"p_id": "core", "p_now": 42})
    assert (row.messages, row.updated_ns) == (5, 42)
    assert storage.write_at_once(statement, {"p_id": "core", "p_now": 43}) is None  # not 0 now
    psycopg = storage.driver._psycopg
    assert psycopg is not None
    sql, own, wanted = psycopg.sql(statement)
    assert psycopg.sql(statement)[0] is sql  # compiled once
    assert wanted == {"p_id", "p_now"} and not wanted & own.keys()  # the caller's to give
    # A parameter left out is the caller's defect, not the store failing (never retried).
    with pytest.raises(ValueError, match="p_now"):
        storage.write_at_once(statement, {"p_id": "core"})
    assert not is_store_error(ValueError())
    # A parameter whose name SQLAlchemy would have to escape in the SQL is refused outright
    # (it would otherwise be sent under another name than the caller's).
    odd = text("SELECT CAST(:p AS text) AS v").bindparams(bindparam("p"))
    assert storage.write_at_once(odd, {"p": "x"}).v == "x"
    escaped = update(sessions_table).values(messages=bindparam("p count")).returning(s.id)
    with pytest.raises(ValueError, match="plain identifiers"):
        storage.write_at_once(escaped, {"p count": 1})


def test_an_error_comes_back_as_sqlalchemys_and_the_connection_stays_usable(
    storage: SqlStorage,
) -> None:
    statement, params = add_session("dup")
    storage.write_at_once(statement, params)
    with pytest.raises(sqlalchemy.exc.IntegrityError) as refused:
        storage.write_at_once(statement, params)
    assert "duplicate key" in str(refused.value)
    assert is_store_error(refused.value) and not transient(refused.value)
    assert refused.value.connection_invalidated is False
    with pytest.raises(sqlalchemy.exc.DataError):
        storage.write_at_once(text("SELECT CAST(:p AS integer) AS n"), {"p": "not a number"})
    assert storage.write_at_once(text("SELECT 7 AS n"), {}).n == 7
    with storage.transaction() as conn:  # and the pool's connections are still whole
        assert conn.execute(select(sessions_table.c.id)).scalars().all() == ["dup"]


def test_a_backend_killed_mid_statement_is_a_transient_error_and_its_connection_goes(
    storage: SqlStorage,
) -> None:
    admin: Any = _admin_connection()
    assert admin is not None
    try:
        pid_of = text("SELECT pg_backend_pid() AS pid")
        victim = storage.write_at_once(pid_of, {}).pid
        caught: list[BaseException] = []

        def sleeper() -> None:
            try:
                # A statement that runs long: its backend is killed.
                storage.write_at_once(text("SELECT pg_sleep(5) AS slept"), {})
            except BaseException as exc:  # the test reads it
                caught.append(exc)

        thread = threading.Thread(target=sleeper)
        thread.start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the sleeper's statement is running
            found = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%%'"
            ).fetchall()
            if found:
                break
            time.sleep(0.02)  # the polling pace, bounded by the deadline above
        assert [row[0] for row in found] == [victim]
        admin.execute("SELECT pg_terminate_backend(%s)", [victim])
        thread.join(10)
        assert len(caught) == 1
        error = caught[0]
        assert isinstance(error, sqlalchemy.exc.OperationalError)
        assert error.connection_invalidated is True
        assert is_store_error(error) and transient(error)
        # The dead connection left the pool: the next statement runs on another backend.
        assert storage.write_at_once(pid_of, {}).pid != victim
    finally:
        admin.close()


def test_a_pooled_connection_whose_backend_went_is_replaced_before_the_statement(
    storage: SqlStorage,
) -> None:
    """The pool's checkout ping (``storage.engine``) looks at each connection taken for a
    direct statement too: one the server dropped while it sat in the pool is never used."""
    admin: Any = _admin_connection()
    assert admin is not None
    try:
        pid_of = text("SELECT pg_backend_pid() AS pid")
        victim = storage.write_at_once(pid_of, {}).pid
        admin.execute("SELECT pg_terminate_backend(%s)", [victim])
        time.sleep(0.3)  # the server's goodbye reaches the socket
        # Nobody retries this call: it must find a working connection at once.
        statement, params = add_session("after")
        assert storage.write_at_once(statement, params).id == "after"
        assert storage.write_at_once(pid_of, {}).pid != victim
    finally:
        admin.close()


def test_a_server_that_cannot_be_reached_is_a_transient_store_error(storage: SqlStorage) -> None:
    """No connection to be had (the pool empty, the server gone): the same SQLAlchemy error
    as ``Connection.execute`` raises, which the worker's retries take for the store away."""
    from fault_harness import FaultProxy
    from storage_backends import PG_PORT

    proxy = FaultProxy(PG_PORT)
    url = storage.url.replace(f":{PG_PORT}/", f":{proxy.port}/")
    through = SqlStorage(url)
    try:
        statement, params = add_session("through")
        assert through.write_at_once(statement, params).id == "through"
        through.engine.dispose()  # no pooled connection left
        proxy.close()  # and nothing listens where the server was
        with pytest.raises(sqlalchemy.exc.OperationalError) as away:
            through.write_at_once(text("SELECT 1 AS one"), {})
        assert is_store_error(away.value) and transient(away.value)
    finally:
        through.close()


def test_observers_see_each_statement_before_it_goes(storage: SqlStorage) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    storage.driver.observers.append(lambda sql, rows: seen.append((sql, dict(rows[0]))))
    statement, params = add_session("seen")
    storage.write_at_once(statement, params)
    assert seen == [(storage.driver.sql(statement), {"p_id": "seen"})]
    assert "%(p_id)s" in seen[0][0]  # the driver's own SQL
