"""Sessions and the audit trail in one SQL database, through SQLAlchemy Core.

    storage = SqlStorage("sqlite:///.hermes/state.db")      # the default: a file, WAL mode
    storage = SqlStorage("postgresql+psycopg://user@host/db")  # the same code on PostgreSQL

``storage.sessions`` holds conversations (one row per message), ``storage.audit`` takes audit
records (one row each), and the storage reads the trail back (the ``Storage`` seam of
``storage.base``). The tables are defined in ``storage.schema`` with every other table the
project keeps in SQL, and the storage applies its migration chain when it opens: a
``schema_version`` table holds one row per applied migration, and every migration newer than the
database's latest row runs in order, in one transaction, under a lock (SQLite's write lock; a
PostgreSQL advisory lock), so starting many processes at once is safe and starting again is a
no-op. The engine is made by ``storage.engine.make_engine``.

Audit writes never wait for the database: ``storage.audit`` is a ``WriteBehindSink`` around
``SqlAuditSink`` (one transaction per call), so a process killed at any moment leaves whole steps
or nothing, and one record the database refuses costs only that record. ``flush`` waits for the
queue to drain (it also runs at interpreter exit).

Text reaches this backend already redacted by the agent (and audit records already storable).
Rows are made storable here, where text is encoded: a lone surrogate or NUL in a text column is
written as a ``\\uXXXX`` escape; in the JSON columns (tool calls and results) the escape is
JSON's own, so that text reads back exactly as it was. No text can make a write fail.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Executable,
    bindparam,
    func,
    insert,
    select,
)
from sqlalchemy.exc import SQLAlchemyError

from hermes_agent.audit.records import RECORD_FIELDS, AuditRecord, Role, records_to_jsonl
from hermes_agent.audit.redaction import sanitized_note, storable
from hermes_agent.memory.session import SessionSummary
from hermes_agent.storage.base import MAX_ID_LENGTH, RequestSummary, StorageError
from hermes_agent.storage.driver import CoreTransaction, Driver
from hermes_agent.storage.engine import (
    SINGLE,
    SQLITE_BUSY_TIMEOUT_MS,
    WRITE,
    is_memory_url,
    make_engine,
)
from hermes_agent.storage.engine import safe_url as _safe_url
from hermes_agent.storage.schema import (
    LATEST_VERSION,
    MIGRATIONS,
    audit_table,
    messages_table,
    metadata,
    schema_version,
    sessions_table,
    upgrade,
)
from hermes_agent.storage.session_lease import SessionLease, SessionLeases
from hermes_agent.storage.statements import append_turn, dialect_insert, turn_write
from hermes_agent.storage.writer import WriteBehindSink
from hermes_agent.types import Message, ToolCall, ToolResult

logger = logging.getLogger("hermes_agent")

DEFAULT_URL = "sqlite:///.hermes/state.db"
"""Where state lives unless the config says otherwise: a SQLite file under the working folder."""


# The tables, the migrations and the engine settings live in storage.schema and storage.engine;
# they stay importable from here.
__all__ = [
    "DEFAULT_URL",
    "LATEST_VERSION",
    "MIGRATIONS",
    "SQLITE_BUSY_TIMEOUT_MS",
    "SqlAuditSink",
    "SqlSessionStore",
    "SqlStorage",
    "append_messages",
    "audit_table",
    "messages_table",
    "metadata",
    "schema_version",
    "sessions_table",
]


# -- the storage -------------------------------------------------------------------------


class SqlStorage:
    """Sessions (``.sessions``) and the audit trail (``.audit``, and the reader methods) in one
    database: the ``Storage`` seam.

    ``url`` is a SQLAlchemy URL: ``sqlite:///relative/path.db``, ``sqlite:////abs/path.db``,
    ``sqlite://`` (in memory, this process only) or ``postgresql+psycopg://user:pw@host/db``.
    The parent folder of a SQLite file is created when missing.

    >>> storage = SqlStorage("sqlite://")
    >>> storage.sessions.append("s1", [Message("user", "hi")])
    >>> [m.content for m in storage.sessions.load("s1")]
    ['hi']
    >>> storage.close()
    """

    max_id_length = MAX_ID_LENGTH

    def __init__(self, url: str = DEFAULT_URL, *, echo: bool = False) -> None:
        self.url = url
        self.engine = make_engine(url, echo=echo)
        # An in-memory SQLite database is one connection shared by every thread: transactions
        # must take turns on it. A file or a server gives each thread its own connection.
        self._memory = self.engine.dialect.name == "sqlite" and is_memory_url(url)
        self.in_memory = self._memory
        self._tx_guard: threading.RLock | None = threading.RLock() if self._memory else None
        self._autocommits = self.engine.dialect.name == "postgresql"
        # The writes every run makes go through the driver (``storage.driver``), which alone
        # chooses how they are sent.
        self.driver = Driver(
            self.engine,
            guard=self._tx_guard,
            transaction=self.transaction,
            one_statement=self.one_statement,
            echo=echo,
        )
        try:
            self.schema_version = self._migrate()
        except SQLAlchemyError as exc:
            self.engine.dispose()
            raise StorageError(f"cannot open the database {_safe_url(url)}: {exc}") from exc
        if not self.engine.dialect.insert_returning:  # known once a connection was made
            self.engine.dispose()
            raise StorageError(
                f"the database {_safe_url(url)} has no INSERT ... RETURNING: SQLite 3.35 or "
                "newer (2021) is needed"
            )
        self.sessions = SqlSessionStore(self)
        self.audit = WriteBehindSink(SqlAuditSink(self))
        self._closed = False

    # -- transactions -------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Connection]:
        """A connection inside one transaction, committed on success. ``write=True`` takes
        SQLite's write lock up front (``BEGIN IMMEDIATE``), so a read-then-write transaction
        waits its turn instead of failing when another writer got there first."""
        guard = self._tx_guard if self._tx_guard is not None else contextlib.nullcontext()
        with guard:
            conn = self.engine.connect()
            try:
                if write:
                    conn = conn.execution_options(**WRITE)
                with conn.begin():
                    yield conn
            finally:
                conn.close()

    @contextlib.contextmanager
    def one_statement(self, *, write: bool = False) -> Iterator[Connection]:
        """A connection for a single statement, which is atomic on its own: on PostgreSQL it
        runs in autocommit, with no ``BEGIN`` and ``COMMIT`` (two of the three round trips a
        one-statement transaction costs); a read from a SQLite file sends no ``BEGIN`` either
        (a writer still takes the write lock up front, and an in-memory database is used in
        turns, as ``transaction`` does). Only for one statement: two statements through it
        would not be one transaction."""
        if not self._autocommits:
            if write or self._memory:  # a writer takes SQLite's lock up front; memory takes turns
                with self.transaction(write=write) as conn:
                    yield conn
                return
            # A read from a file (SQLite): in autocommit, the statement reads one snapshot.
            with self.engine.connect().execution_options(**SINGLE) as conn, conn.begin():
                yield conn
            return
        conn = self.engine.connect()
        try:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")
        finally:
            conn.close()

    def write_at_once(self, statement: Executable, params: dict[str, Any]) -> Any | None:
        """One statement that writes, atomic on its own, and its first row (columns as
        attributes) or ``None`` (``Driver.first_at_once``)."""
        return self.driver.first_at_once(statement, params)

    def _migrate(self) -> int:
        # Every table the project owns (storage.schema), not only the sessions and the trail.
        guard = self._tx_guard if self._tx_guard is not None else contextlib.nullcontext()
        with guard:
            return upgrade(self.engine)

    # -- audit queries ------------------------------------------------------------------

    def requests(self, limit: int = 50) -> list[RequestSummary]:
        """The latest recorded requests, newest first: ``request_id``, ``session_id``,
        ``started`` (ISO 8601, UTC), ``steps`` (model turns), ``status`` / ``status_code``
        (of the final OutputRenderer record; ``stopped`` with the code of the ``stopped``
        record a service wrote when it stopped the run; ``incomplete`` when neither exists),
        ``model``, ``records``."""
        self.audit.flush()
        a = audit_table.c
        summary = (
            select(
                a.request_id,
                func.min(a.session_id).label("session_id"),
                func.min(a.timestamp_ns).label("started_ns"),
                func.max(a.timestamp_ns).label("ended_ns"),
                func.count().label("records"),
                func.max(a.model_name).label("model"),
            )
            .group_by(a.request_id)
            .order_by(func.min(a.timestamp_ns).desc(), a.request_id)
            .limit(limit)
        )
        with self.transaction() as conn:
            rows = conn.execute(summary).all()
            ids = [row.request_id for row in rows]
            finals: dict[str, tuple[str, int]] = {}
            turns: dict[str, int] = {}
            if ids:
                for row in conn.execute(
                    select(a.request_id, a.role, a.status, a.status_code).where(
                        a.request_id.in_(ids),
                        a.role.in_([Role.OUTPUT.value, Role.STOPPED.value]),
                    )
                ):
                    if row.role == Role.OUTPUT.value:
                        finals[row.request_id] = (row.status, row.status_code)
                    else:
                        finals.setdefault(row.request_id, ("stopped", row.status_code))
                for row in conn.execute(
                    select(a.request_id, func.count())
                    .where(a.request_id.in_(ids), a.role == Role.COMPLETION.value)
                    .group_by(a.request_id)
                ):
                    turns[row[0]] = int(row[1])
        return [
            RequestSummary(
                request_id=row.request_id,
                session_id=row.session_id,
                started=_iso(row.started_ns),
                duration_ms=round((row.ended_ns - row.started_ns) / 1e6, 3),
                steps=turns.get(row.request_id, 0),
                status=finals.get(row.request_id, ("incomplete", 0))[0],
                status_code=finals.get(row.request_id, ("incomplete", 0))[1],
                model=row.model,
                records=int(row.records),
            )
            for row in rows
        ]

    def records(self, request_id: str) -> list[AuditRecord]:
        """Every record of one request, in the order they were made."""
        self.audit.flush()
        a = audit_table.c
        query = (
            select(*(getattr(a, name) for name in RECORD_FIELDS))
            .where(a.request_id == request_id)
            .order_by(a.seq, a.id)
        )
        with self.transaction() as conn:
            return [AuditRecord(**row._asdict()) for row in conn.execute(query)]

    def session_requests(self, session_id: str) -> list[str]:
        """The request ids recorded for a session, oldest first."""
        self.audit.flush()
        a = audit_table.c
        query = (
            select(a.request_id)
            .where(a.session_id == session_id)
            .group_by(a.request_id)
            .order_by(func.min(a.timestamp_ns), a.request_id)
        )
        with self.transaction() as conn:
            return [row[0] for row in conn.execute(query)]

    def request_ids_with_prefix(self, prefix: str, limit: int = 10) -> list[str]:
        """The recorded request ids that start with ``prefix`` (case-sensitive), shortest then
        alphabetical, at most ``limit``: how the command line takes an id by its first
        characters. A whole id is its own prefix, so it comes first. Scans the trail; look a
        whole id up with ``records``."""
        self.audit.flush()
        column = audit_table.c.request_id
        with self.transaction() as conn:
            return _ids_with_prefix(conn, column, prefix, limit)

    def export_jsonl(self, request_id: str) -> str:
        """The records of one request as JSON Lines (one record per line, every field), which
        ``parse_jsonl`` turns back into equal records."""
        return records_to_jsonl(self.records(request_id))

    def close(self) -> None:
        """Store what is queued, stop the writer and release the connections."""
        if self._closed:
            return
        self._closed = True
        self.audit.close()
        if self.sessions.leases is not None:
            self.sessions.leases.close()
        self.engine.dispose()

    def __enter__(self) -> SqlStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqlStorage({_safe_url(self.url)!r})"


# -- sessions ----------------------------------------------------------------------------


_LOAD_SESSION = (
    select(messages_table)
    .where(messages_table.c.session_id == bindparam("p_session_id"))
    .order_by(messages_table.c.position)
)
"""A session's messages in order (built once: building a statement costs more than running it)."""


class SqlSessionStore:
    """Conversations in SQL: the ``StoredSessions`` seam (``SessionStore`` plus listing and
    deleting).

    ``append`` adds one turn's messages in one transaction; ``lock`` serialises runs on one
    session in every process that shares the database (``storage.session_lease``; an
    in-memory database has one process). Messages are stored as given: the agent redacts them
    before they get here.
    """

    def __init__(self, storage: SqlStorage) -> None:
        self._storage = storage
        self._locks: weakref.WeakValueDictionary[str, SessionLease] = weakref.WeakValueDictionary()
        self._guard = threading.Lock()
        sqlite = storage.engine.dialect.name == "sqlite"
        self.leases: SessionLeases | None = (
            None
            if storage.in_memory
            else SessionLeases(
                storage.engine, lambda: storage.one_statement(write=True), on_loop=sqlite
            )
        )

    def answers_at_once(self, session_id: str, *, append: bool) -> bool:
        """SQLite answers on the agent's event loop (``memory.session.AnswersAtOnce``): a read
        of its WAL takes no lock, and an append waits only while another writer of the file
        holds its lock — in one process the trail's writer and the service's own short writes
        (keys, quotas, a facade's seeded turns) — where a thread hop cost the service 1.3 ms of
        CPU a run under load (docs/decisions.md). A server (PostgreSQL) is waited for over the
        network: its calls go to a thread."""
        return self._storage.engine.dialect.name == "sqlite"

    def load(self, session_id: str) -> list[Message]:
        with _failing_as("read session", session_id), self._storage.one_statement() as conn:
            rows = conn.execute(_LOAD_SESSION, {"p_session_id": session_id})
            return [_message_from_row(row._mapping) for row in rows]

    def append(self, session_id: str, messages: Sequence[Message]) -> None:
        if not messages:
            return
        storage = self._storage
        engine = storage.engine
        write = turn_write(
            engine.dialect.name,
            engine.dialect.identifier_preparer.quote,
            session_id,
            message_rows("", 0, messages),
            time.time_ns(),
        )
        with _failing_as("append to session", session_id):
            storage.driver.write(write)

    def lock(self, session_id: str) -> SessionLease:
        # Weak values: a session's lock lives while a run holds it, so a process that serves
        # millions of sessions keeps no lock per session forever.
        with self._guard:
            found = self._locks.get(session_id)
            if found is None:
                found = SessionLease(self.leases, session_id)
                self._locks[session_id] = found
            return found

    def list_sessions(self, limit: int | None = None) -> list[SessionSummary]:
        """Sessions, most recently updated first: ``id``, ``created``, ``updated`` (ISO 8601,
        UTC), ``turns`` (user messages) and ``messages``."""
        s = sessions_table.c
        query = select(sessions_table).order_by(s.updated_ns.desc(), s.id)
        if limit is not None:
            query = query.limit(limit)
        with self._storage.transaction() as conn:
            return [
                SessionSummary(
                    id=row.id,
                    created=_iso(row.created_ns),
                    updated=_iso(row.updated_ns),
                    turns=row.turns,
                    messages=row.messages,
                )
                for row in conn.execute(query)
            ]

    def session_ids(self) -> list[str]:
        """Every session id (as ``InMemorySessionStore.session_ids``)."""
        with self._storage.transaction() as conn:
            return [row[0] for row in conn.execute(select(sessions_table.c.id))]

    def session_ids_with_prefix(self, prefix: str, limit: int = 10) -> list[str]:
        """The session ids that start with ``prefix`` (case-sensitive), shortest then
        alphabetical, at most ``limit`` (see ``SqlStorage.request_ids_with_prefix``)."""
        with self._storage.transaction() as conn:
            return _ids_with_prefix(conn, sessions_table.c.id, prefix, limit)

    def create(self, session_id: str) -> None:
        """Make ``session_id`` a session with no message, where it is none yet."""
        with (
            _failing_as("create session", session_id),
            self._storage.transaction(write=True) as conn,
        ):
            _insert_session_if_missing(conn, session_id, time.time_ns())

    def exists(self, session_id: str) -> bool:
        """Whether ``session_id`` is a session, empty or not."""
        query = select(sessions_table.c.id).where(sessions_table.c.id == session_id)
        with _failing_as("read session", session_id), self._storage.one_statement() as conn:
            return conn.execute(query).first() is not None

    def delete(self, session_id: str) -> bool:
        """Forget a session's messages; ``True`` when it existed. Its audit records stay (an
        audit trail is not the user's to edit)."""
        with self._storage.transaction(write=True) as conn:
            conn.execute(messages_table.delete().where(messages_table.c.session_id == session_id))
            gone = conn.execute(
                sessions_table.delete().where(sessions_table.c.id == session_id)
            ).rowcount
        return bool(gone)


def _ids_with_prefix(conn: Connection, column: Any, prefix: str, limit: int) -> list[str]:
    # substr, not LIKE: SQLite's LIKE ignores case and both read % and _ as wildcards.
    query = (
        select(column)
        .where(func.substr(column, 1, len(prefix)) == prefix)
        .group_by(column)
        .order_by(func.length(column), column)
        .limit(limit)
    )
    return [row[0] for row in conn.execute(query)]


def _insert_session_if_missing(conn: Connection, session_id: str, now: int) -> None:
    values = {"id": session_id, "created_ns": now, "updated_ns": now, "turns": 0, "messages": 0}
    dialect = conn.dialect.name
    if dialect in ("postgresql", "sqlite"):
        conn.execute(
            dialect_insert(dialect)(sessions_table).values(values).on_conflict_do_nothing()
        )
    else:
        found = conn.execute(
            select(sessions_table.c.id).where(sessions_table.c.id == session_id)
        ).first()
        if found is None:
            conn.execute(insert(sessions_table).values(values))


def message_row(session_id: str, position: int, message: Message) -> dict[str, Any]:
    """The ``messages`` row of ``message`` at ``position`` in its session."""
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls]
    results = [
        {
            "call_id": r.call_id,
            "name": r.name,
            "content": r.content,
            "status_code": r.status_code,
            "error": r.error,
        }
        for r in message.tool_results
    ]
    return {
        "session_id": session_id,
        "position": position,
        "role": message.role,
        "content": _text(message.content),
        "tool_calls": _dumps(calls) if calls else None,
        "tool_results": _dumps(results) if results else None,
        "scratch_pad": _text(message.scratch_pad),
        "raw": _text(message.raw),
    }


def message_rows(session_id: str, start: int, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The ``messages`` rows of ``messages``, placed from ``start`` in their session."""
    return [message_row(session_id, start + i, m) for i, m in enumerate(messages)]


@contextlib.contextmanager
def _failing_as(what: str, session_id: str) -> Iterator[None]:
    try:
        yield
    except SQLAlchemyError as exc:
        raise StorageError(f"cannot {what} {session_id[:80]!r}: {exc}") from exc


def _text(value: str | None) -> str | None:
    return storable(value)[0] if value else value


def _message_from_row(row: Any) -> Message:
    calls = json.loads(row["tool_calls"]) if row["tool_calls"] else []
    results = json.loads(row["tool_results"]) if row["tool_results"] else []
    return Message(
        role=row["role"],
        content=row["content"],
        tool_calls=[ToolCall(c["name"], c["arguments"], c["id"]) for c in calls],
        tool_results=[ToolResult(**r) for r in results],
        scratch_pad=row["scratch_pad"],
        raw=row["raw"],
    )


def _dumps(value: Any) -> str:
    # Tool results may hold anything a tool returned; what JSON cannot hold is kept as text,
    # as the protocol does when it renders the result for the model. JSON already escapes
    # NUL; a lone surrogate becomes JSON's own escape (\udXXX) here, so it reads back as it was.
    return storable(json.dumps(value, ensure_ascii=False, default=str))[0]


# -- audit -------------------------------------------------------------------------------


class SqlAuditSink:
    """The ``AuditSink`` seam, stored at once: ``write`` inserts the records it is given in
    one transaction, and raises when the database refuses them. ``SqlStorage.audit`` wraps it
    in a ``WriteBehindSink``, so runs never wait for it."""

    def __init__(self, storage: SqlStorage) -> None:
        self._storage = storage

    def write(self, records: Sequence[AuditRecord]) -> None:
        rows = [_audit_row(record) for record in records]
        if rows:
            with self._storage.driver.transaction(write=True) as tx:
                tx.insert_many(audit_table, rows)

    def flush(self) -> None:
        """Nothing is queued here."""


def _audit_row(record: AuditRecord) -> dict[str, Any]:
    row = record.to_dict()
    escaped = 0
    for name, value in row.items():
        if isinstance(value, str) and name != "sanitized":
            row[name], count = storable(value)
            escaped += count
    if escaped and row["sanitized"] is None:
        row["sanitized"] = sanitized_note(escaped)
    return row


def append_messages(conn: Connection, session_id: str, messages: Sequence[Message]) -> None:
    """Add one turn's messages to a session inside the caller's transaction (the queue workers
    save a turn and mark their run done in one transaction), in its database's one form
    (``storage.statements``)."""
    if messages:
        quote = conn.dialect.identifier_preparer.quote
        rows = message_rows("", 0, messages)
        append_turn(CoreTransaction(conn), quote, session_id, rows, time.time_ns())


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="milliseconds")
