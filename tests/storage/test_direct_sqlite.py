"""SQLite transactions straight on sqlite3 (``storage.driver``): a turn's append and the
trail's records store what the SQLAlchemy path stores; a failure rolls the whole transaction
back and comes out as the SQLAlchemy error (``StorageError`` from the session store), with the
pooled connection usable afterwards; a database locked by another writer waits and then fails
cleanly; an in-memory database's writers take turns."""

from __future__ import annotations

import logging
import shutil
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc
from sqlalchemy import insert, text

from hermes_agent.audit.records import AuditRecord
from hermes_agent.storage import SqlStorage
from hermes_agent.storage.base import StorageError
from hermes_agent.storage.schema import audit_table, messages_table, sessions_table
from hermes_agent.storage.sql import SqlAuditSink, append_messages
from hermes_agent.storage.statements import _count_in_statement, row_by_row
from hermes_agent.types import Message, ToolCall, ToolResult

TURN = [
    Message("user", "charge 5"),
    Message("assistant", "", tool_calls=[ToolCall("charge", {"amount": 5}, "c1")]),
    Message("tool", "", tool_results=[ToolResult("c1", "charge", "charged 5")]),
    Message("assistant", "done", scratch_pad="thought"),
]


@pytest.fixture(name="storage")
def file_storage(tmp_path: Path) -> Iterator[SqlStorage]:
    storage = SqlStorage(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        yield storage
    finally:
        storage.close()


def observed(storage: SqlStorage) -> list[tuple[str, int]]:
    """The statements the storage's direct transactions send from now on: (SQL, rows)."""
    sent: list[tuple[str, int]] = []

    def note(sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        sent.append((sql, len(rows)))

    storage.driver.observers.append(note)
    return sent


def stored_rows(storage: SqlStorage, table: str) -> list[tuple[Any, ...]]:
    with storage.transaction() as conn:
        return [tuple(row) for row in conn.execute(text(f"SELECT * FROM {table} ORDER BY 1, 2"))]


def test_a_file_store_appends_directly_and_stores_what_sqlalchemy_stores(
    storage: SqlStorage, tmp_path: Path
) -> None:
    sent = observed(storage)
    storage.sessions.append("s1", TURN)
    storage.sessions.append("s1", TURN[:1])
    assert [rows for _, rows in sent] == [1, 4, 1, 1]  # count-in, messages; twice
    assert sent[0][0].startswith("INSERT INTO sessions") and "RETURNING" in sent[0][0]
    loaded = storage.sessions.load("s1")
    assert [m.role for m in loaded] == ["user", "assistant", "tool", "assistant", "user"]
    assert loaded[1].tool_calls == TURN[1].tool_calls
    assert loaded[2].tool_results == TURN[2].tool_results
    assert loaded[3].scratch_pad == "thought"

    # The same two appends through SQLAlchemy's transaction, in another database.
    other = SqlStorage(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        for turn in (TURN, TURN[:1]):
            with other.transaction(write=True) as conn:
                append_messages(conn, "s1", turn)
        mine, theirs = stored_rows(storage, "messages"), stored_rows(other, "messages")
        assert mine == theirs and len(mine) == 5
        session = [row[3:] for row in stored_rows(storage, "sessions")]
        assert session == [row[3:] for row in stored_rows(other, "sessions")] == [(2, 5)]
    finally:
        other.close()


def record(request_id: str, seq: int, latency: Any = 1.5) -> AuditRecord:
    return AuditRecord(
        request_id, "s1", 0, "Input", "user", "hi\x00there", 10 + seq, latency, "ok", 200, "m",
        "0" * 64, seq,
    )  # fmt: skip


def test_trail_records_go_directly_with_sqlalchemy_s_conversions(storage: SqlStorage) -> None:
    sent = observed(storage)
    # A Decimal is stored only once the Double column's float() converted it (sqlite3
    # refuses it as it is).
    SqlAuditSink(storage).write([record("r1", 0), record("r1", 1, latency=Decimal("2.5"))])
    assert [rows for _, rows in sent] == [2]
    found = storage.records("r1")
    assert [r.seq for r in found] == [0, 1]
    assert found[1].latency_ms == 2.5 and isinstance(found[1].latency_ms, float)
    assert found[0].content == "hi\\u0000there" and found[0].sanitized  # made storable
    direct = storage.driver._sqlite3
    assert direct is not None
    columns = ("latency_ms", "seq")
    _, processors, _ = direct.sql(row_by_row(audit_table, columns), columns)
    assert set(processors) == {"latency_ms"}  # the Double column's float(), as SQLAlchemy's
    with pytest.raises(ValueError, match=r"parameters \['seq'\]"), direct.transaction() as tx:
        tx.insert_many(audit_table, [{"latency_ms": 1.0, "seq": 1}, {"latency_ms": 2.0}])


def test_a_failure_rolls_the_whole_transaction_back(storage: SqlStorage) -> None:
    storage.sessions.append("s1", TURN[:1])
    direct = storage.driver._sqlite3
    assert direct is not None
    bound = {"p_id": "s1", "p_now": 1, "p_added": 1, "p_users": 1}
    taken = {"session_id": "s1", "position": 0, "role": "user", "content": "again"}
    with pytest.raises(sqlalchemy.exc.IntegrityError), direct.transaction(write=True) as tx:
        assert tx.scalar(_count_in_statement("sqlite"), bound) == 2
        tx.insert_many(messages_table, [taken])  # position 0 is taken
    assert [row[3:] for row in stored_rows(storage, "sessions")] == [(1, 1)]  # not counted in

    with pytest.raises(KeyboardInterrupt), direct.transaction(write=True) as tx:
        tx.scalar(_count_in_statement("sqlite"), bound)
        raise KeyboardInterrupt  # an interrupt in the middle: nothing of it stays
    assert [row[3:] for row in stored_rows(storage, "sessions")] == [(1, 1)]
    storage.sessions.append("s1", TURN[:1])  # the pooled connection is left usable
    assert [m.content for m in storage.sessions.load("s1")] == ["charge 5", "charge 5"]


def test_a_database_locked_by_another_writer_fails_cleanly(
    storage: SqlStorage, tmp_path: Path
) -> None:
    storage.sessions.append("s1", TURN[:1])
    pooled = storage.engine.raw_connection()
    pooled.driver_connection.execute("PRAGMA busy_timeout=100")  # type: ignore[union-attr]
    pooled.close()  # the pool's one idle connection: the next write takes it
    holder = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StorageError, match=r"cannot append to session 's1'.*locked"):
            storage.sessions.append("s1", TURN[:1])
        with pytest.raises(sqlalchemy.exc.OperationalError, match="locked"):
            SqlAuditSink(storage).write([record("r1", 0)])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    storage.sessions.append("s1", TURN[:1])  # nothing was left half done, nor any lock held
    assert len(storage.sessions.load("s1")) == 2
    assert storage.records("r1") == []


def test_a_database_that_cannot_be_opened_is_a_storage_error(tmp_path: Path) -> None:
    folder = tmp_path / "gone"
    storage = SqlStorage(f"sqlite:///{folder / 'state.db'}")
    try:
        storage.engine.dispose()  # no pooled connection: the next write opens the file
        shutil.rmtree(folder)
        with pytest.raises(StorageError, match="cannot append to session 's1'"):
            storage.sessions.append("s1", TURN[:1])
    finally:
        storage.close()


def test_an_in_memory_database_s_writers_take_turns() -> None:
    storage = SqlStorage("sqlite://")
    try:
        assert storage.driver._sqlite3 is not None

        def append(n: int) -> None:
            for _ in range(20):
                storage.sessions.append(f"s{n % 2}", TURN[:2])

        threads = [threading.Thread(target=append, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads)
        for session in ("s0", "s1"):
            assert [m.role for m in storage.sessions.load(session)] == ["user", "assistant"] * 60
    finally:
        storage.close()


def test_echo_logs_the_direct_statements_and_never_changes_their_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    echoed = SqlStorage(f"sqlite:///{tmp_path / 'echo.db'}", echo=True)
    try:
        sent = observed(echoed)
        with caplog.at_level(logging.INFO, logger="sqlalchemy.engine.Engine"):
            echoed.sessions.append("s1", TURN[:2])
        assert len(sent) == 2  # the count-in and the messages, sent straight on sqlite3
        logged = [r.getMessage() for r in caplog.records if r.name == "sqlalchemy.engine.Engine"]
        assert any(sql in line for sql, _ in sent for line in logged)
        assert [m.content for m in echoed.sessions.load("s1")] == [m.content for m in TURN[:2]]
    finally:
        echoed.close()


def test_only_caller_values(storage: SqlStorage) -> None:
    direct = storage.driver._sqlite3
    assert direct is not None
    with pytest.raises(ValueError, match="every value from its caller"):
        direct.sql(insert(sessions_table).values(id="x", created_ns=1))
