"""SQLAlchemy engines made one way for every store the project keeps in SQL (sessions and the
audit trail, API keys, quota counts, stream tokens, channels, queued runs).

    engine = make_engine("sqlite:///.hermes/state.db")   # WAL, a busy timeout, a private file
    engine = make_engine("postgresql+psycopg://user@host/db")

A SQLite file is created readable by its owner only, with its folder; every SQLite connection
runs in WAL mode with a busy timeout, and a transaction opened on a connection with the
``hermes_write`` execution option (``WRITE``) takes the write lock up front (``BEGIN
IMMEDIATE``), so a read-then-write transaction waits its turn instead of failing when another
writer got there first. An in-memory SQLite database (``sqlite://``) is one connection shared by
every thread of the process (``is_memory_url``): its users take turns on it. A PostgreSQL
connection leaving the pool is pinged only when its socket shows the server said something
(``_ping_when_not_quiet``), not on every checkout.
"""

from __future__ import annotations

import os
import re
import select
import sqlite3
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.pool import StaticPool

from hermes_agent.storage.base import StorageError

SQLITE_BUSY_TIMEOUT_MS = 10_000

WRITE: dict[str, Any] = {"hermes_write": True}
"""Execution options of a connection whose transactions write: ``conn.execution_options(**WRITE)``
(on SQLite, ``BEGIN IMMEDIATE``; elsewhere nothing changes)."""


SINGLE_STATEMENT_OPTION = "hermes_single_statement"
SINGLE: dict[str, Any] = {SINGLE_STATEMENT_OPTION: True}
"""Execution options of a SQLite connection that runs one statement, atomic on its own: its
transaction sends no ``BEGIN`` (and so its commit has nothing to commit)."""


POOL_SIZE = 20
"""Connections a process keeps open to a database server. A worker runs 10 runs at a time, each
with a lease thread beside it: SQLAlchemy's default of 5 kept, and closed on return, the
connections over five, so a busy worker forked a PostgreSQL backend every few runs."""
POOL_OVERFLOW = 10
"""Connections opened over ``POOL_SIZE`` at a peak, closed when they come back."""


def make_engine(url: str, *, echo: bool = False) -> Engine:
    """The engine for a SQLAlchemy URL (``StorageError`` when it is not one, or its driver is
    missing): ``sqlite:///relative/path.db``, ``sqlite:////abs/path.db``, ``sqlite://`` (in
    memory, this process only) or ``postgresql+psycopg://user:pw@host/db``."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise StorageError(
            f"storage url {url!r} is not a database URL; use e.g. sqlite:///.hermes/state.db "
            "or postgresql+psycopg://user@host/dbname"
        ) from exc
    if parsed.get_backend_name() != "sqlite":
        try:
            engine = create_engine(
                parsed, echo=echo, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW
            )
        except Exception as exc:
            raise StorageError(f"cannot use {safe_url(url)}: {exc}") from exc
        _ping_when_not_quiet(engine)
        return engine
    if is_memory_url(url):
        engine = create_engine(
            parsed,
            echo=echo,
            poolclass=StaticPool,
            connect_args={"check_same_thread": False},
        )
    else:
        database = parsed.database or ""
        if not database.startswith("file:"):
            _create_private(Path(database).expanduser())
        engine = create_engine(parsed, echo=echo, connect_args={"check_same_thread": False})
    _sqlite_events(engine)
    return engine


def is_memory_url(url: str) -> bool:
    """Whether a SQLite URL names an in-memory database (``sqlite://``, ``:memory:``,
    ``mode=memory``)."""
    database = make_url(url).database
    return not database or database == ":memory:" or "mode=memory" in database


def safe_url(url: str) -> str:
    """The URL with its password hidden, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return re.sub(r"//[^@/]*@", "//***@", url)


@runtime_checkable
class SharesEngine(Protocol):
    """A store whose database other stores may keep their tables in (the API keys' database
    holds the quota counts, the stream tokens and the channels' tables)."""

    @property
    def shared_engine(self) -> Engine | None:
        """The engine to share, or ``None`` when the store's database is this process's memory
        (what lives beside it then lives in memory too)."""
        ...


def shared_engine(store: object) -> Engine | None:
    """The engine ``store`` shares (``SharesEngine``), ``None`` when it shares none."""
    return store.shared_engine if isinstance(store, SharesEngine) else None


def _create_private(path: Path) -> None:
    """Create the SQLite file readable by its owner only (0600), with its folder, unless it
    exists: it holds every conversation, tool result and API key hash. SQLite gives its
    ``-wal`` and ``-shm`` files the database file's mode, so they are private too. An existing
    file keeps the mode it has (its owner chose it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(descriptor)


def _ping_when_not_quiet(engine: Engine) -> None:
    """Check a pooled connection as it leaves the pool, for the price of one ``poll``: a
    connection whose socket has nothing to say is used as it is; one whose socket is readable
    (the server closed it, reset it, or said something unasked) is pinged first, and one that
    fails the ping is replaced.

    SQLAlchemy's ``pool_pre_ping`` pings every checkout: one more round trip, and one more
    transaction for the server, for each transaction (docs/decisions.md). A server that
    restarted, or a proxy that reset the connection, shows on the socket (its goodbye, its
    reset), so those are still found before a statement fails on them. A driver whose
    connections have no socket to look at is pinged every time."""
    dialect = engine.dialect

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if _quiet(dbapi_connection):
            return
        try:
            dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # This connection goes (the pool opens another); each other connection the server
            # dropped shows on its own socket when its turn comes.
            raise DisconnectionError(f"the connection failed its ping: {exc}") from exc


def _quiet(dbapi_connection: Any) -> bool:
    """Whether a psycopg connection is open and has nothing waiting on its socket (a pooled
    connection is idle: the pool rolled it back when it came back)."""
    pgconn = getattr(dbapi_connection, "pgconn", None)
    if pgconn is None or getattr(dbapi_connection, "closed", True):
        return False
    try:
        descriptor = pgconn.socket
    except Exception:  # no socket: the connection is closed or broken
        return False
    try:
        if not hasattr(select, "poll"):
            readable, _, failed = select.select([descriptor], [], [descriptor], 0)
            return not readable and not failed
        poller = select.poll()
        poller.register(descriptor, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (OSError, ValueError):  # a socket that cannot be looked at: ping it instead
        return False


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
        # SQLite can answer "database is locked" to the switch without waiting the busy
        # timeout (a new file that several processes open at once): try it again a while.
        for pause in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0):
            try:
                cursor.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc):
                    raise
                time.sleep(pause)
        else:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if options.get(SINGLE_STATEMENT_OPTION, False):
            return  # one statement, atomic on its own (``SINGLE``): no BEGIN, no COMMIT
        write = options.get("hermes_write", False)
        # Through SQLAlchemy, so that a failure (the busy timeout, a full disk) comes out as
        # its OperationalError, which the store's retries and error reports know.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
