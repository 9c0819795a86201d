"""The PostgreSQL connection pool's checks (``storage.engine``) against real servers: a pooled
connection whose socket is quiet is used without a ping; one whose server went away — its
backend terminated, a proxy that reset it, the server restarted — is replaced before a statement
can fail on it, so a store call that is never retried still succeeds. ``SqlStorage.one_statement``
runs its statement in autocommit on PostgreSQL; on a SQLite file a read sends no ``BEGIN`` and a
write takes the lock up front, and an in-memory SQLite keeps its transactions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from fault_harness import FaultProxy, OwnPostgres, own_postgres
from hermes_agent import Message
from hermes_agent.storage import SqlStorage
from storage_backends import _admin_connection


def count_pings(engine: Engine) -> list[int]:
    """Count the pings of ``engine``'s checkouts (the dialect's ``do_ping``) in the list."""
    pings = [0]
    ping = engine.dialect.do_ping

    def counted(dbapi_connection: Any) -> bool:
        pings[0] += 1
        return ping(dbapi_connection)

    engine.dialect.do_ping = counted  # type: ignore[method-assign]
    return pings


def backend_pid(storage: SqlStorage) -> int:
    with storage.transaction() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_a_quiet_pooled_connection_is_used_without_a_ping(pg_url: str) -> None:
    storage = SqlStorage(pg_url)
    try:
        pings = count_pings(storage.engine)
        first = backend_pid(storage)
        for n in range(30):
            storage.sessions.append("s", [Message("user", f"turn {n}")])
            assert len(storage.sessions.load("s")) == n + 1
        assert pings[0] == 0
        assert backend_pid(storage) == first  # one pooled connection, used throughout
    finally:
        storage.close()


def test_a_connection_whose_backend_was_terminated_is_replaced_before_it_is_used(
    pg_url: str,
) -> None:
    storage = SqlStorage(pg_url)
    admin: Any = _admin_connection()
    try:
        storage.sessions.append("s", [Message("user", "before")])
        pings = count_pings(storage.engine)
        victim = backend_pid(storage)
        admin.execute("SELECT pg_terminate_backend(%s)", [victim])
        time.sleep(0.3)  # the server's goodbye reaches the socket
        # Neither call is retried by anyone: each must find a working connection at once.
        assert [m.content for m in storage.sessions.load("s")] == ["before"]
        storage.sessions.append("s", [Message("user", "after")])
        assert pings[0] >= 1
        assert backend_pid(storage) != victim
    finally:
        admin.close()
        storage.close()


def test_connections_a_proxy_reset_are_replaced_before_they_are_used(pg_url: str) -> None:
    from storage_backends import PG_PORT

    proxy = FaultProxy(PG_PORT)
    storage = SqlStorage(pg_url.replace(f":{PG_PORT}/", f":{proxy.port}/"))
    try:
        storage.sessions.append("s", [Message("user", "before")])
        assert proxy.reset() >= 1
        time.sleep(0.3)  # the reset reaches the socket
        assert [m.content for m in storage.sessions.load("s")] == ["before"]
        storage.sessions.append("s", [Message("user", "after")])
        assert len(storage.sessions.load("s")) == 2
    finally:
        storage.close()
        proxy.close()


@pytest.mark.skipif(not OwnPostgres.available(), reason="needs initdb and runuser")
def test_a_restarted_server_fails_no_store_call() -> None:
    with own_postgres() as server:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/postgres"
        storage = SqlStorage(url)
        try:
            # Several pooled connections, all of which the restart closes.
            held = [storage.engine.connect() for _ in range(3)]
            for conn in held:
                conn.execute(text("SELECT 1"))
                conn.close()
            storage.sessions.append("s", [Message("user", "before")])
            server.restart("fast", down_s=0.5)
            for n in range(5):
                assert storage.sessions.load("s")[0].content == "before"
                storage.sessions.append("s", [Message("user", f"after {n}")])
            assert len(storage.sessions.load("s")) == 6
        finally:
            storage.close()


def test_one_statement_is_autocommit_on_postgresql(pg_url: str) -> None:
    storage = SqlStorage(pg_url)
    try:
        from psycopg.pq import TransactionStatus

        with storage.one_statement(write=True) as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            # The server reports no transaction left open after the statement.
            raw: Any = conn.connection.dbapi_connection
            assert raw.info.transaction_status == TransactionStatus.IDLE
        with storage.transaction() as conn:  # the same pooled connection, given back as it was
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid
            raw = conn.connection.dbapi_connection
            assert raw.info.transaction_status == TransactionStatus.INTRANS
    finally:
        storage.close()


def test_one_statement_on_sqlite_reads_with_no_begin_and_writes_with_the_lock(
    tmp_path: Path,
) -> None:
    storage = SqlStorage(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        storage.sessions.append("s", [Message("user", "hi")])
        with storage.one_statement() as conn:
            assert conn.execute(text("SELECT count(*) FROM messages")).scalar_one() == 1
            raw: Any = conn.connection.dbapi_connection
            assert raw.in_transaction is False  # the read sent no BEGIN
        with storage.one_statement(write=True) as conn:
            conn.execute(text("SELECT 1"))
            raw = conn.connection.dbapi_connection
            assert raw.in_transaction is True  # BEGIN IMMEDIATE: the write lock up front
        with storage.transaction() as conn:  # the pooled connection begins as before
            conn.execute(text("SELECT 1"))
            assert conn.connection.dbapi_connection.in_transaction is True  # type: ignore[union-attr]
        assert [m.content for m in storage.sessions.load("s")] == ["hi"]
    finally:
        storage.close()


def test_one_statement_on_an_in_memory_sqlite_takes_its_turn() -> None:
    storage = SqlStorage("sqlite://")
    try:
        storage.sessions.append("s", [Message("user", "hi")])
        with storage.one_statement() as conn:  # the shared connection, in a transaction
            assert conn.connection.dbapi_connection.in_transaction is True  # type: ignore[union-attr]
        assert [m.content for m in storage.sessions.load("s")] == ["hi"]
    finally:
        storage.close()
