"""A SQLite transaction straight on the driver's connection, for the writes a run makes on the
service's event loop with a SQLite store: its turn appended to its session, and its trail
records (the run's accepted record, and the written-behind bursts).

Through ``Connection.execute`` one such transaction took about 300 µs of CPU (a connection
object, its ``begin`` event, an execution context and a result per statement, the commit and
the reset), where the driver itself needs about 80 µs for the same statements. The run's
append and its accepted record are written on the event loop (a local file answers at once:
``memory.session.AnswersAtOnce``), so that time is every other run's too. Here the
statements are compiled once to ``sqlite3``'s own SQL and sent on a connection of the same
pool, between a ``BEGIN`` (``IMMEDIATE`` for a writer, as ``SqlStorage.transaction`` does)
and a ``COMMIT``; a failure rolls back.

What the caller sees does not change: values go through the same conversions SQLAlchemy
applies (a column type's bind processor), an in-memory database still takes turns, and a
driver error comes back as the SQLAlchemy error ``Connection.execute`` raises for it
(``OperationalError`` for a database that stayed locked past the busy timeout), so
``_failing_as``, the trail writer's retries and ``errors.is_store_error`` see no difference.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, Executable
from sqlalchemy.exc import DBAPIError

from hermes_agent.storage.direct import (
    CompiledOnce,
    check_given,
    checked_out,
    driver_error,
    plainly_named,
)

Observer = Callable[[str, Sequence[Mapping[str, Any]]], None]
"""Told each statement sent (its SQL and its rows of parameters), before it is sent."""

Processors = dict[str, Callable[[Any], Any]]
"""The conversions SQLAlchemy applies to a statement's values, by parameter."""

Compiled = tuple[str, Processors, frozenset[str]]
"""A statement in sqlite3's SQL, the conversions of its values, the parameters it wants."""


class SqliteTransactions:
    """Transactions on a SQLite engine's pooled connections, past SQLAlchemy's execution
    machinery (see the module doc). ``guard``: the lock an in-memory database's users take
    turns with (``SqlStorage``'s), or ``None`` for a file."""

    def __init__(self, engine: Engine, guard: threading.RLock | None = None) -> None:
        if engine.dialect.name != "sqlite" or engine.dialect.driver != "pysqlite":
            raise ValueError("direct SQLite transactions are for sqlite3 (pysqlite) engines")
        self.engine = engine
        self.guard = guard
        self.observers: list[Observer] = []
        # sqlite3 takes ``:name`` parameters from a mapping; SQLAlchemy's own dialect for the
        # engine sends ``?`` ones in a tuple.
        self._dialect: Any = type(engine.dialect)(paramstyle="named")  # type: ignore[call-arg]
        self._compiled: CompiledOnce[Compiled] = CompiledOnce()

    def sql(self, statement: Executable, columns: Sequence[str] = ()) -> Compiled:
        """``statement`` in ``sqlite3``'s SQL (``:name`` parameters), compiled once; the
        conversions of its values; and the names of the parameters it wants. ``columns``: for
        an ``insert(table)`` with no values, the columns the rows give."""

        def make() -> Compiled:
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
    def transaction(self, *, write: bool = False) -> Iterator[SqliteTransaction]:
        """One transaction on a pooled connection: ``BEGIN IMMEDIATE`` for a writer (it takes
        the write lock up front, waiting up to the busy timeout), ``BEGIN`` otherwise;
        committed when the block ends, rolled back when it raises."""
        guard = self.guard if self.guard is not None else contextlib.nullcontext()
        with guard:
            fairy = checked_out(self.engine)
            connection: Any = fairy.driver_connection
            try:
                self._send(connection, "BEGIN IMMEDIATE" if write else "BEGIN", ())
                yield SqliteTransaction(self, connection)
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


class SqliteTransaction:
    """The statements of one ``SqliteTransactions.transaction``."""

    def __init__(self, owner: SqliteTransactions, connection: Any) -> None:
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

    def insert_many(self, statement: Executable, rows: Sequence[Mapping[str, Any]]) -> None:
        """Send ``statement`` (an ``insert(table)`` with no values) once for each of ``rows``,
        mappings with the same keys: the columns it fills."""
        if not rows:
            return
        sql, processors, wanted = self._owner.sql(statement, tuple(rows[0]))
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
