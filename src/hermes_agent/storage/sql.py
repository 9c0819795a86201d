"""Sessions and the audit trail in one SQL database, through SQLAlchemy Core.

    storage = SqlStorage("sqlite:///.hermes/state.db")      # the default: a file, WAL mode
    storage = SqlStorage("postgresql+psycopg://user@host/db")  # the same code on PostgreSQL

``storage.sessions`` is a ``SessionStore`` (conversations, one row per message) and
``storage.audit`` an ``AuditSink`` (one row per audit record). The schema is created, or
migrated, when the storage opens: a ``schema_version`` table holds one row per applied
migration, and every migration newer than the database's latest row runs in order, in one
transaction, under a lock (SQLite's write lock; a PostgreSQL advisory lock), so starting many
processes at once is safe and starting again is a no-op.

Audit writes never wait for the database: ``write`` queues the records of one step and returns;
a background thread stores what is queued, each batch inside one transaction, so a process killed
at any moment leaves whole steps or nothing. ``flush`` waits for the queue to drain (it also runs
at interpreter exit).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import queue
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Double,
    Engine,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import StaticPool

from hermes_agent.audit.records import AuditRecord
from hermes_agent.errors import HermesAgentError
from hermes_agent.types import Message, ToolCall, ToolResult

logger = logging.getLogger("hermes_agent")

DEFAULT_URL = "sqlite:///.hermes/state.db"
"""Where state lives unless the config says otherwise: a SQLite file under the working folder."""

SQLITE_BUSY_TIMEOUT_MS = 10_000


class StorageError(HermesAgentError):
    """The database cannot be opened, migrated or read as asked."""


# -- schema ------------------------------------------------------------------------------

metadata = MetaData()

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_ns", BigInteger, nullable=False),
)

sessions_table = Table(
    "sessions",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("created_ns", BigInteger, nullable=False),
    Column("updated_ns", BigInteger, nullable=False),
    Column("turns", Integer, nullable=False, default=0),
    Column("messages", Integer, nullable=False, default=0),
)

messages_table = Table(
    "messages",
    metadata,
    Column("session_id", String(255), primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("role", String(16), nullable=False),
    Column("content", Text, nullable=False),
    Column("tool_calls", Text, nullable=True),
    Column("tool_results", Text, nullable=True),
    Column("scratch_pad", Text, nullable=True),
    Column("raw", Text, nullable=True),
)

audit_table = Table(
    "audit_records",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("request_id", String(64), nullable=False),
    Column("session_id", String(255), nullable=False),
    Column("step", Integer, nullable=False),
    Column("stage", String(32), nullable=False),
    Column("role", String(16), nullable=False),
    Column("content", Text, nullable=False),
    Column("timestamp_ns", BigInteger, nullable=False),
    Column("latency_ms", Double, nullable=False),
    Column("status", String(16), nullable=False),
    Column("status_code", Integer, nullable=False),
    Column("model_name", String(255), nullable=False),
    Column("system_prompt_sha256", String(64), nullable=False),
    Column("seq", Integer, nullable=False),
    Index("ix_audit_request_seq", "request_id", "seq"),
    Index("ix_audit_session", "session_id"),
    Index("ix_audit_time", "timestamp_ns"),
)

_Migration = Callable[[Connection], None]


def _v1_initial(conn: Connection) -> None:
    for table in (sessions_table, messages_table, audit_table):
        table.create(conn, checkfirst=True)


MIGRATIONS: dict[int, _Migration] = {1: _v1_initial}
"""Schema version → the step that brings a database from the version before up to it. A new
schema change is a new entry; existing entries never change once released."""

LATEST_VERSION = max(MIGRATIONS)

# The PostgreSQL advisory lock key that serialises migrations across processes.
_MIGRATION_LOCK_KEY = 0x48_45_52_4D  # "HERM"


# -- the storage -------------------------------------------------------------------------


class SqlStorage:
    """Sessions (``.sessions``) and the audit trail (``.audit``) in one database.

    ``url`` is a SQLAlchemy URL: ``sqlite:///relative/path.db``, ``sqlite:////abs/path.db``,
    ``sqlite://`` (in memory, this process only) or ``postgresql+psycopg://user:pw@host/db``.
    The parent folder of a SQLite file is created when missing.

    >>> storage = SqlStorage("sqlite://")
    >>> storage.sessions.append("s1", [Message("user", "hi")])
    >>> [m.content for m in storage.sessions.load("s1")]
    ['hi']
    >>> storage.close()
    """

    def __init__(self, url: str = DEFAULT_URL, *, echo: bool = False) -> None:
        self.url = url
        self.engine = _make_engine(url, echo=echo)
        # An in-memory SQLite database is one connection shared by every thread: transactions
        # must take turns on it. A file or a server gives each thread its own connection.
        self._memory = self.engine.dialect.name == "sqlite" and _is_memory(url)
        self._tx_guard: threading.RLock | None = threading.RLock() if self._memory else None
        try:
            self.schema_version = self._migrate()
        except SQLAlchemyError as exc:
            self.engine.dispose()
            raise StorageError(f"cannot open the database {_safe_url(url)}: {exc}") from exc
        self.sessions = SqlSessionStore(self)
        self.audit = SqlAuditSink(self)
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
                    conn = conn.execution_options(hermes_write=True)
                with conn.begin():
                    yield conn
            finally:
                conn.close()

    def _migrate(self) -> int:
        with self.transaction(write=True) as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY}
                )
            schema_version.create(conn, checkfirst=True)
            current = conn.execute(select(func.max(schema_version.c.version))).scalar() or 0
            if current > LATEST_VERSION:
                raise StorageError(
                    f"the database {_safe_url(self.url)} has schema version {current}, newer than "
                    f"this hermes-agent understands ({LATEST_VERSION}); upgrade hermes-agent-core"
                )
            for version in sorted(v for v in MIGRATIONS if v > current):
                MIGRATIONS[version](conn)
                conn.execute(
                    insert(schema_version).values(version=version, applied_ns=time.time_ns())
                )
                logger.info(
                    "storage: migrated %s to schema version %d", _safe_url(self.url), version
                )
            return max(current, LATEST_VERSION)

    # -- audit queries ------------------------------------------------------------------

    def requests(self, limit: int = 50) -> list[dict[str, Any]]:
        """The latest recorded requests, newest first: ``request_id``, ``session_id``,
        ``started`` (ISO 8601, UTC), ``steps`` (model turns), ``status`` / ``status_code``
        (of the final OutputRenderer record; ``incomplete`` when the run never got there),
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
                    select(a.request_id, a.status, a.status_code).where(
                        a.request_id.in_(ids), a.stage == "OutputRenderer"
                    )
                ):
                    finals[row.request_id] = (row.status, row.status_code)
                for row in conn.execute(
                    select(a.request_id, func.count())
                    .where(a.request_id.in_(ids), a.role == "completion")
                    .group_by(a.request_id)
                ):
                    turns[row[0]] = int(row[1])
        return [
            {
                "request_id": row.request_id,
                "session_id": row.session_id,
                "started": _iso(row.started_ns),
                "duration_ms": round((row.ended_ns - row.started_ns) / 1e6, 3),
                "steps": turns.get(row.request_id, 0),
                "status": finals.get(row.request_id, ("incomplete", 0))[0],
                "status_code": finals.get(row.request_id, ("incomplete", 0))[1],
                "model": row.model,
                "records": int(row.records),
            }
            for row in rows
        ]

    def records(self, request_id: str) -> list[AuditRecord]:
        """Every record of one request, in the order they were made."""
        self.audit.flush()
        a = audit_table.c
        query = (
            select(*(getattr(a, name) for name in _RECORD_FIELDS))
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

    def export_jsonl(self, request_id: str) -> str:
        """The records of one request as JSON Lines (one record per line, every field), which
        ``parse_jsonl`` turns back into equal records."""
        return "".join(
            json.dumps(record.to_dict(), ensure_ascii=False) + "\n"
            for record in self.records(request_id)
        )

    def close(self) -> None:
        """Store what is queued, stop the writer and release the connections."""
        if self._closed:
            return
        self._closed = True
        self.audit.close()
        self.engine.dispose()

    def __enter__(self) -> SqlStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqlStorage({_safe_url(self.url)!r})"


_RECORD_FIELDS = (
    "request_id",
    "session_id",
    "step",
    "stage",
    "role",
    "content",
    "timestamp_ns",
    "latency_ms",
    "status",
    "status_code",
    "model_name",
    "system_prompt_sha256",
    "seq",
)


def parse_jsonl(text: str) -> list[AuditRecord]:
    """Records from ``export_jsonl`` output. Lines are split on ``\\n`` only: a record's text
    may hold other line separators (U+2028...), which JSON leaves unescaped."""
    return [AuditRecord(**json.loads(line)) for line in text.split("\n") if line.strip()]


# -- sessions ----------------------------------------------------------------------------


class SqlSessionStore:
    """Conversations in SQL: the ``SessionStore`` seam plus listing and deleting.

    ``append`` adds one turn's messages in one transaction; ``lock`` serialises runs on one
    session inside this process (across processes, the transaction keeps positions apart).
    """

    def __init__(self, storage: SqlStorage) -> None:
        self._storage = storage
        self.redactor: Callable[[str], str] | None = None
        """Applied to every text of a message before it is stored (the Agent sets its audit
        redactor here), so secrets reach neither the trail nor the conversation at rest."""
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._guard = threading.Lock()

    def load(self, session_id: str) -> list[Message]:
        m = messages_table.c
        query = select(messages_table).where(m.session_id == session_id).order_by(m.position)
        with self._storage.transaction() as conn:
            return [_message_from_row(row._mapping) for row in conn.execute(query)]

    def append(self, session_id: str, messages: Sequence[Message]) -> None:
        if not messages:
            return
        now = time.time_ns()
        s = sessions_table.c
        with self._storage.transaction(write=True) as conn:
            _insert_session_if_missing(conn, session_id, now)
            # FOR UPDATE holds the row on PostgreSQL until commit, so two processes appending
            # to one session take turns; SQLite's write lock already did that.
            start = conn.execute(
                select(s.messages).where(s.id == session_id).with_for_update()
            ).scalar_one()
            conn.execute(
                insert(messages_table),
                [
                    _message_row(session_id, start + i, m, self.redactor)
                    for i, m in enumerate(messages)
                ],
            )
            conn.execute(
                update(sessions_table)
                .where(s.id == session_id)
                .values(
                    updated_ns=now,
                    messages=s.messages + len(messages),
                    turns=s.turns + sum(1 for m in messages if m.role == "user"),
                )
            )

    def lock(self, session_id: str) -> threading.Lock:
        # Weak values: a session's lock lives while a run holds it, so a process that serves
        # millions of sessions keeps no lock per session forever.
        with self._guard:
            found = self._locks.get(session_id)
            if found is None:
                found = threading.Lock()
                self._locks[session_id] = found
            return found

    def list_sessions(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Sessions, most recently updated first: ``id``, ``created``, ``updated`` (ISO 8601,
        UTC), ``turns`` (user messages) and ``messages``."""
        s = sessions_table.c
        query = select(sessions_table).order_by(s.updated_ns.desc(), s.id)
        if limit is not None:
            query = query.limit(limit)
        with self._storage.transaction() as conn:
            return [
                {
                    "id": row.id,
                    "created": _iso(row.created_ns),
                    "updated": _iso(row.updated_ns),
                    "turns": row.turns,
                    "messages": row.messages,
                }
                for row in conn.execute(query)
            ]

    def session_ids(self) -> list[str]:
        """Every session id (as ``InMemorySessionStore.session_ids``)."""
        with self._storage.transaction() as conn:
            return [row[0] for row in conn.execute(select(sessions_table.c.id))]

    def delete(self, session_id: str) -> bool:
        """Forget a session's messages; ``True`` when it existed. Its audit records stay (an
        audit trail is not the user's to edit)."""
        with self._storage.transaction(write=True) as conn:
            conn.execute(messages_table.delete().where(messages_table.c.session_id == session_id))
            gone = conn.execute(
                sessions_table.delete().where(sessions_table.c.id == session_id)
            ).rowcount
        return bool(gone)


def _insert_session_if_missing(conn: Connection, session_id: str, now: int) -> None:
    values = {"id": session_id, "created_ns": now, "updated_ns": now, "turns": 0, "messages": 0}
    dialect = conn.dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        conn.execute(pg_insert(sessions_table).values(values).on_conflict_do_nothing())
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        conn.execute(sqlite_insert(sessions_table).values(values).on_conflict_do_nothing())
    else:
        found = conn.execute(
            select(sessions_table.c.id).where(sessions_table.c.id == session_id)
        ).first()
        if found is None:
            conn.execute(insert(sessions_table).values(values))


def _message_row(
    session_id: str, position: int, message: Message, redact: Callable[[str], str] | None
) -> dict[str, Any]:
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
    row: dict[str, Any] = {
        "session_id": session_id,
        "position": position,
        "role": message.role,
        "content": message.content,
        "tool_calls": _dumps(calls) if calls else None,
        "tool_results": _dumps(results) if results else None,
        "scratch_pad": message.scratch_pad,
        "raw": message.raw,
    }
    if redact:
        for key in ("content", "scratch_pad", "raw"):
            if row[key]:
                row[key] = redact(row[key])
        # Inside JSON, redact each string value, so a pattern can never break the JSON.
        if calls:
            row["tool_calls"] = _dumps(_redact_strings(calls, redact))
        if results:
            row["tool_results"] = _dumps(_redact_strings(results, redact))
    return row


def _redact_strings(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_strings(v, redact) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_strings(v, redact) for v in value]
    return value


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
    # as the protocol does when it renders the result for the model.
    return json.dumps(value, ensure_ascii=False, default=str)


# -- audit -------------------------------------------------------------------------------

_STOP = object()
_HURRY = object()  # from flush(): store what is queued now


class SqlAuditSink:
    """The ``AuditSink`` seam, written behind: ``write`` queues and returns at once.

    One background thread stores the queue; each transaction holds whole batches (one batch is
    one step), so a crash leaves whole steps or nothing. A batch that cannot be stored is
    retried, then logged and dropped: the audit trail never fails a run.
    """

    RETRIES = 3
    LINGER_S = 0.02
    """Write once no new step has arrived for this long..."""
    MAX_DELAY_S = 0.5
    """...or once the oldest queued step has waited this long..."""
    MAX_RECORDS = 2000
    """...or once this many records are queued."""

    def __init__(self, storage: SqlStorage) -> None:
        self._storage = storage
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_guard = threading.Lock()
        self._closed = False
        self.dropped = 0
        """Records that could not be stored (each one also logged)."""
        self._exit_hook = _weak_call(self, "flush")
        atexit.register(self._exit_hook)

    def write(self, records: Sequence[AuditRecord]) -> None:
        if not records:
            return
        if self._closed:
            raise StorageError("the audit sink is closed; records can no longer be written")
        self._ensure_thread()
        self._queue.put(list(records))

    def flush(self) -> None:
        """Return once every batch written so far is stored (or given up on)."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_HURRY)
            self._queue.join()

    def close(self) -> None:
        """Flush, then stop the writer thread."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._exit_hook)
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._start_guard:
            if self._thread is None or not self._thread.is_alive():
                # Daemon: a forgotten storage must not keep the process alive; the atexit
                # flush is what stores the tail of the queue.
                self._thread = threading.Thread(
                    target=self._drain, name="hermes-audit-writer", daemon=True
                )
                self._thread.start()

    def _drain(self) -> None:
        while True:
            batches, stop = self._collect()
            try:
                if batches:
                    self._store([b for b in batches if b is not _HURRY])
            finally:
                for _ in range(len(batches) + (1 if stop else 0)):
                    self._queue.task_done()
            if stop:
                return

    def _collect(self) -> tuple[list[Any], bool]:
        """Wait for work, then keep taking batches while steps keep coming (up to a bound):
        one transaction per burst, written when the run pauses, keeps the writer off the GIL
        while steps run back to back. Still whole steps only; ``flush`` cuts the wait short."""
        item = self._queue.get()
        if item is _STOP:
            return [], True
        taken: list[Any] = [item]
        if item is _HURRY:
            return taken, False
        count = len(item)
        started = time.monotonic()
        while count < self.MAX_RECORDS:
            waited = time.monotonic() - started
            if waited >= self.MAX_DELAY_S:
                break
            try:
                item = self._queue.get(timeout=min(self.LINGER_S, self.MAX_DELAY_S - waited))
            except queue.Empty:
                break
            if item is _STOP:
                return taken, True
            taken.append(item)
            if item is _HURRY:
                break
            count += len(item)
        return taken, False

    def _store(self, batches: list[list[AuditRecord]]) -> None:
        rows = [
            {name: getattr(record, name) for name in _RECORD_FIELDS}
            for batch in batches
            for record in batch
        ]
        if not rows:
            return
        for attempt in range(1, self.RETRIES + 1):
            try:
                with self._storage.transaction(write=True) as conn:
                    conn.execute(insert(audit_table), rows)
                return
            except Exception as exc:
                if attempt == self.RETRIES:
                    self.dropped += len(rows)
                    logger.error(
                        "audit: %d records could not be stored and were dropped: %s",
                        len(rows),
                        exc,
                    )
                    return
                time.sleep(0.05 * attempt)


def _weak_call(owner: object, method: str) -> Callable[[], None]:
    # atexit must not keep every storage ever opened alive.
    ref = weakref.ref(owner)

    def call() -> None:
        target = ref()
        if target is not None:
            getattr(target, method)()

    return call


# -- engine ------------------------------------------------------------------------------


def _make_engine(url: str, *, echo: bool) -> Engine:
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise StorageError(
            f"storage url {url!r} is not a database URL; use e.g. sqlite:///.hermes/state.db "
            "or postgresql+psycopg://user@host/dbname"
        ) from exc
    if parsed.get_backend_name() != "sqlite":
        try:
            return create_engine(parsed, echo=echo, pool_pre_ping=True)
        except Exception as exc:
            raise StorageError(f"cannot use {_safe_url(url)}: {exc}") from exc
    if _is_memory(url):
        engine = create_engine(
            parsed,
            echo=echo,
            poolclass=StaticPool,
            connect_args={"check_same_thread": False},
        )
    else:
        database = parsed.database or ""
        if not database.startswith("file:"):
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, echo=echo, connect_args={"check_same_thread": False})
    _sqlite_events(engine)
    return engine


def _sqlite_events(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's BEGIN (below) start transactions, not the driver's implicit
        # deferred BEGIN, so that writers can take the lock up front.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # The busy timeout first: switching a new file to WAL needs a moment's exclusive lock,
        # which another process opening the same file at once may hold.
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get("hermes_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _is_memory(url: str) -> bool:
    database = make_url(url).database
    return not database or database == ":memory:" or "mode=memory" in database


def _safe_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return re.sub(r"//[^@/]*@", "//***@", url)


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="milliseconds")
