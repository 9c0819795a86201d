"""Where a statement meets the database's driver: the one place that chooses how it is sent.

A record the store writes is a ``Write`` built by ``storage.statements`` (one builder per
record and database); ``Driver.write`` sends it as its form asks, and no caller chooses:

- ``Driver.first_at_once``: one statement, atomic on its own (a queued run's claim, heartbeat,
  model turn and ending, a turn appended to a session on PostgreSQL); on PostgreSQL it is sent
  on a pooled psycopg connection in autocommit, one round trip.
- ``Driver.transaction``: statements in one transaction (``scalar``, ``insert_many``: a turn
  appended to a session on SQLite, a burst of trail records); on SQLite it runs on a pooled
  sqlite3 connection between ``BEGIN [IMMEDIATE]`` and ``COMMIT``.

- ``Driver.core``: a SQLAlchemy ``Connection`` in one transaction, for steps that need more
  than those two (the fenced steps of a queued run on SQLite) and for every other statement
  (reads, claims, approvals).

Everything else, and these on other drivers, goes through SQLAlchemy's ``Connection``. Why the
two bypasses: SQLAlchemy's execution machinery (an execution context, a result object, the
isolation level set and reset per checkout) costs as much CPU as the driver's own work for
these small statements. With both taken out (``benchmarks/bench_store_calls.py``), one queued
run's store calls on PostgreSQL cost 7.8 ms of CPU (client and server) instead of 4.1, and a
service run's writes on SQLite 0.72 ms instead of 0.41 (docs/benchmarks.md).

What a caller sees does not depend on the executor: the first row (columns as attributes) or
``None``, the same conversions of values SQLAlchemy applies, an in-memory database taking
turns, and a driver error given back as the SQLAlchemy error ``Connection.execute`` raises for
it (``OperationalError`` for a connection lost or a database locked past the busy timeout),
the pooled connection thrown away where the error says it is gone, so the retries and
``errors.is_store_error`` see no difference. ``echo`` logs the statements sent here as
SQLAlchemy logs its own; it never changes how they are sent.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Engine, Executable, Table
from sqlalchemy.exc import DBAPIError, StatementError

from hermes_agent.storage.statements import Transaction, Write, insert_rows, row_by_row

Observer = Callable[[str, Sequence[Mapping[str, Any]]], None]
"""Told each statement sent past SQLAlchemy (its SQL and its rows of parameters), before it
is sent."""

__all__ = ["CoreTransaction", "Driver", "Transaction"]

Compiled = tuple[str, dict[str, Any], frozenset[str]]
"""A statement in psycopg's SQL, the values it binds itself, the parameters it wants."""

Processors = dict[str, Callable[[Any], Any]]
"""The conversions SQLAlchemy applies to a statement's values, by parameter."""

SqliteCompiled = tuple[str, Processors, frozenset[str]]
"""A statement in sqlite3's SQL, the conversions of its values, the parameters it wants."""

_Made = TypeVar("_Made")

_echo_log = logging.getLogger("sqlalchemy.engine.Engine")


class Driver:
    """How a ``SqlStorage``'s run writes reach its database (see the module doc):
    ``transaction`` and ``one_statement`` are the storage's own SQLAlchemy ones, used where no
    bypass applies."""

    def __init__(
        self,
        engine: Engine,
        *,
        guard: threading.RLock | None,
        transaction: Callable[..., AbstractContextManager[Connection]],
        one_statement: Callable[..., AbstractContextManager[Connection]],
        echo: bool = False,
    ) -> None:
        self.observers: list[Observer] = []
        if echo:
            self.observers.append(_echoed)
        driver = engine.dialect.driver
        self._psycopg = _PsycopgStatements(engine, self.observers) if driver == "psycopg" else None
        self._sqlite3 = (
            _SqliteTransactions(engine, guard, self.observers) if driver == "pysqlite" else None
        )
        self._core_transaction = transaction
        self._one_statement = one_statement

    def write(self, write: Write[_Made]) -> _Made:
        """Send a record's write (``storage.statements``) the way its form asks: one
        statement alone (``first_at_once``), steps in a ``transaction``, or steps on a
        SQLAlchemy ``Connection`` in a write transaction of the storage's. The one place that
        chooses; no caller does."""
        if write.statement is not None:
            assert write.read is not None
            return write.read(self.first_at_once(write.statement, write.params))
        if write.steps is not None:
            with self.transaction(write=True) as tx:
                return write.steps(tx)
        assert write.core is not None
        with self.core(write=True) as conn:
            return write.core(conn)

    def core(self, *, write: bool = False) -> AbstractContextManager[Connection]:
        """A SQLAlchemy ``Connection`` in one transaction of the storage's (``write``: SQLite's
        write lock taken up front): the store's other statements, and a record's ``core``
        steps."""
        return self._core_transaction(write=write)

    def first_at_once(self, statement: Executable, params: Mapping[str, Any]) -> Any | None:
        """One statement that writes, atomic on its own, and its first row (columns as
        attributes) or ``None``."""
        if self._psycopg is not None:
            return self._psycopg.first(statement, params)
        with self._one_statement(write=True) as conn:
            return conn.execute(statement, params).first()

    @contextlib.contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[Transaction]:
        """Statements in one transaction, committed when the block ends (``write``: SQLite's
        write lock taken up front), rolled back when it raises."""
        if self._sqlite3 is not None:
            with self._sqlite3.transaction(write=write) as tx:
                yield tx
            return
        with self._core_transaction(write=write) as conn:
            yield CoreTransaction(conn)

    def sql(self, statement: Executable) -> str:
        """What ``statement`` is sent as past SQLAlchemy (for tests and the echo)."""
        if self._psycopg is not None:
            return self._psycopg.sql(statement)[0]
        if self._sqlite3 is not None:
            return self._sqlite3.sql(statement)[0]
        return str(statement)


def _echoed(sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
    _echo_log.info("%s", sql)
    _echo_log.info("[direct] %r", list(rows) if len(rows) > 1 else (rows[0] if rows else {}))


class CoreTransaction:
    """``Transaction`` on a SQLAlchemy ``Connection``: where no bypass applies, and inside a
    transaction of the caller's own (a queued run's fenced ending)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.dialect = conn.dialect.name

    def scalar(self, statement: Executable, params: Mapping[str, Any]) -> Any:
        return self._conn.execute(statement, dict(params)).scalar()

    def insert_many(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        insert_rows(self._conn, table, rows)


# -- the pieces both bypasses share ------------------------------------------------------------


class CompiledOnce(Generic[_Made]):
    """What a statement object compiles to, made once per statement (and ``extra``): a
    direct statement is built once, in advance, so its compilation is kept with it."""

    BOUND = 512
    """Kept at most (statements are built once each: this is only a bound)."""

    def __init__(self) -> None:
        self._kept: dict[tuple[int, Hashable], tuple[Executable, _Made]] = {}
        self._guard = threading.Lock()

    def get(self, statement: Executable, make: Callable[[], _Made], extra: Hashable = ()) -> _Made:
        key = (id(statement), extra)
        found = self._kept.get(key)
        if found is not None and found[0] is statement:
            return found[1]
        made = make()
        with self._guard:
            if len(self._kept) > self.BOUND:
                self._kept.clear()
            # The statement is kept with what it made, so that its id is not reused meanwhile.
            self._kept[key] = (statement, made)
        return made


def plainly_named(compiled: Any) -> None:
    """Refuse a compiled statement whose SQL names its parameters otherwise than the caller."""
    if compiled.escaped_bind_names:
        raise ValueError("a direct statement's parameters are named as plain identifiers")


def check_given(wanted: frozenset[str], params: Mapping[str, Any]) -> None:
    """A parameter left out is a defect of the caller, not the store failing: a ``ValueError``
    before anything is sent, never retried (the driver's own error would count as the
    store's)."""
    if not wanted.issubset(params):
        missing = sorted(wanted.difference(params))
        raise ValueError(f"no value for the statement's parameters {missing}")


def checked_out(engine: Engine) -> Any:
    """A connection of ``engine``'s pool (its checkout, and its ping); a driver error, where
    none can be had, as SQLAlchemy's (the store is away, or a file cannot be opened)."""
    dbapi = engine.dialect.loaded_dbapi
    try:
        return engine.raw_connection()
    except dbapi.Error as exc:
        raise DBAPIError.instance(
            None,
            None,
            exc,
            dbapi.Error,
            connection_invalidated=engine.dialect.is_disconnect(exc, None, None),
            dialect=engine.dialect,
        ) from exc


def driver_error(
    engine: Engine, exc: Exception, sql: str, params: Any, gone: bool
) -> StatementError:
    """The SQLAlchemy error ``Connection.execute`` raises for the driver's ``exc``
    (parameters hidden); ``gone``: the error says the connection is gone."""
    dbapi = engine.dialect.loaded_dbapi
    return DBAPIError.instance(
        sql,
        params,
        exc,
        dbapi.Error,
        hide_parameters=True,
        connection_invalidated=gone,
        dialect=engine.dialect,
    )


# -- PostgreSQL: single statements on psycopg -------------------------------------------------


class _PsycopgStatements:
    """Single statements sent on a PostgreSQL engine's pooled connections (psycopg), in
    autocommit, past SQLAlchemy's execution machinery."""

    def __init__(self, engine: Engine, observers: list[Observer]) -> None:
        self.engine = engine
        self.observers = observers
        self._compiled: CompiledOnce[Compiled] = CompiledOnce()

    def sql(self, statement: Executable) -> Compiled:
        """``statement`` in the driver's own SQL (its parameters ``%(name)s``), compiled once;
        the values it binds itself (a Core statement's literals); and the names of those the
        caller must give. For a text statement, or a Core one whose parameters need no
        conversion by SQLAlchemy (text, numbers, booleans, ``None``)."""

        def make() -> Compiled:
            compiled = statement.compile(  # type: ignore[attr-defined]
                dialect=self.engine.dialect, compile_kwargs={"render_postcompile": True}
            )
            plainly_named(compiled)
            wanted = frozenset(name for name, bind in compiled.binds.items() if bind.required)
            own = {name: value for name, value in compiled.params.items() if name not in wanted}
            return (str(compiled), own, wanted)

        return self._compiled.get(statement, make)

    def first(self, statement: Executable, params: Mapping[str, Any]) -> Any | None:
        """Send ``statement`` in autocommit with ``params`` (every parameter it does not bind
        itself); its first row (columns as attributes: the statement names them as Python
        identifiers), or ``None`` when it returns none."""
        from psycopg.rows import namedtuple_row

        sql, own, wanted = self.sql(statement)
        if own:
            params = {**own, **params}
        check_given(wanted, params)
        for observe in self.observers:
            observe(sql, [params])
        dbapi = self.engine.dialect.loaded_dbapi
        fairy = checked_out(self.engine)
        connection: Any = fairy.driver_connection
        gone = False
        try:
            connection.autocommit = True
            with connection.cursor(row_factory=namedtuple_row) as cursor:
                cursor.execute(sql, params)
                row = cursor.fetchone() if cursor.description is not None else None
            return row
        except Exception as exc:
            if not isinstance(exc, dbapi.Error):
                raise
            gone = self.engine.dialect.is_disconnect(exc, connection, None)
            if gone:
                fairy.invalidate(exc)
            raise driver_error(self.engine, exc, sql, dict(params), gone) from exc
        finally:
            try:
                if not gone:
                    # As SQLAlchemy leaves it: the pool's next user begins transactions.
                    connection.autocommit = False
            except Exception as exc:  # a connection that cannot say even that: gone
                fairy.invalidate(exc)
            except BaseException:  # interrupted while it was set back: it may not have been
                fairy.invalidate()
                raise
            finally:
                fairy.close()  # back to the pool (a rollback there has nothing to undo)


# -- SQLite: transactions on sqlite3 ----------------------------------------------------------


class _SqliteTransactions:
    """Transactions on a SQLite engine's pooled connections (sqlite3), past SQLAlchemy's
    execution machinery. ``guard``: the lock an in-memory database's users take
    turns with (``SqlStorage``'s), or ``None`` for a file."""

    def __init__(
        self, engine: Engine, guard: threading.RLock | None, observers: list[Observer]
    ) -> None:
        self.engine = engine
        self.guard = guard
        self.observers = observers
        # sqlite3 takes ``:name`` parameters from a mapping; SQLAlchemy's own dialect for the
        # engine sends ``?`` ones in a tuple.
        self._dialect: Any = type(engine.dialect)(paramstyle="named")  # type: ignore[call-arg]
        self._compiled: CompiledOnce[SqliteCompiled] = CompiledOnce()

    def sql(self, statement: Executable, columns: Sequence[str] = ()) -> SqliteCompiled:
        """``statement`` in ``sqlite3``'s SQL (``:name`` parameters), compiled once; the
        conversions of its values; and the names of the parameters it wants. ``columns``: for
        an ``insert(table)`` with no values, the columns the rows give."""

        def make() -> SqliteCompiled:
            compiled = statement.compile(  # type: ignore[attr-defined]
                dialect=self._dialect,
                column_keys=list(columns) or None,
                compile_kwargs={"render_postcompile": True},
            )
            plainly_named(compiled)
            if any(not bind.required for bind in compiled.binds.values()):
                raise ValueError("a direct SQLite statement takes every value from its caller")
            processors: Processors = {}
            for name, bind in compiled.binds.items():
                convert = bind.type.dialect_impl(self._dialect).bind_processor(self._dialect)
                if convert is not None:
                    processors[name] = convert
            return (str(compiled), processors, frozenset(compiled.binds))

        return self._compiled.get(statement, make, tuple(columns))

    @contextlib.contextmanager
    def transaction(self, *, write: bool = False) -> Iterator[_SqliteTransaction]:
        """One transaction on a pooled connection: ``BEGIN IMMEDIATE`` for a writer (it takes
        the write lock up front, waiting up to the busy timeout), ``BEGIN`` otherwise;
        committed when the block ends, rolled back when it raises."""
        guard = self.guard if self.guard is not None else contextlib.nullcontext()
        with guard:
            fairy = checked_out(self.engine)
            connection: Any = fairy.driver_connection
            try:
                self._send(connection, "BEGIN IMMEDIATE" if write else "BEGIN", ())
                yield _SqliteTransaction(self, connection)
                self._send(connection, "COMMIT", ())
            except DBAPIError as exc:
                if exc.connection_invalidated:  # closed under us: never handed out again
                    fairy.invalidate(exc.orig if isinstance(exc.orig, Exception) else None)
                raise
            finally:
                # Back to the pool, whose reset rolls back a transaction a failure or an
                # interrupt left open (and throws away a connection that cannot).
                fairy.close()

    def _send(self, connection: Any, sql: str, rows: Any, many: bool = False) -> Any:
        """``sql`` with ``rows`` (one mapping, or with ``many`` a list of them) on
        ``connection``: its cursor, or the SQLAlchemy error for the driver's."""
        dbapi = self.engine.dialect.loaded_dbapi
        try:
            if many:
                return connection.executemany(sql, rows)
            return connection.execute(sql, rows)
        except dbapi.Error as exc:
            gone = self.engine.dialect.is_disconnect(exc, connection, None)
            raise driver_error(self.engine, exc, sql, rows, gone) from exc


class _SqliteTransaction:
    """The statements of one ``_SqliteTransactions.transaction``."""

    dialect = "sqlite"

    def __init__(self, owner: _SqliteTransactions, connection: Any) -> None:
        self._owner = owner
        self._connection = connection

    def scalar(self, statement: Executable, params: Mapping[str, Any]) -> Any:
        """Send ``statement`` with ``params`` (a value for each of its parameters); the first
        column of its first row, or ``None`` when it returns none."""
        sql, processors, wanted = self._owner.sql(statement)
        check_given(wanted, params)
        params = _converted(params, processors)
        for observe in self._owner.observers:
            observe(sql, [params])
        row = self._owner._send(self._connection, sql, params).fetchone()
        return None if row is None else row[0]

    def insert_many(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert ``rows`` (mappings with the same keys: the columns they fill) into
        ``table``: SQLite's one form of a table's rows (``statements.row_by_row``), sent
        once for each row."""
        if not rows:
            return
        columns = tuple(rows[0])
        sql, processors, wanted = self._owner.sql(row_by_row(table, columns), columns)
        for row in rows:
            check_given(wanted, row)
        if processors:
            rows = [_converted(row, processors) for row in rows]
        for observe in self._owner.observers:
            observe(sql, rows)
        self._owner._send(self._connection, sql, rows, many=True)


def _converted(params: Mapping[str, Any], processors: Processors) -> Mapping[str, Any]:
    if not processors:
        return params
    return {
        name: (processors[name](value) if name in processors and value is not None else value)
        for name, value in params.items()
    }
