"""One statement straight on the driver's connection, for the statements a queued run sends on
every run (its claim, its model turn's batch, its ending), on PostgreSQL.

``Connection.execute`` wraps each statement in SQLAlchemy's execution machinery: an execution
context, a result object, and the isolation level set on the pooled connection and reset as
it goes back. For a statement built in advance that costs about as much CPU as the round trip
itself: the store calls of one queued run took 4.9 ms of their caller's CPU through it, and
3.5 ms sent this way (docs/benchmarks.md, fourteenth round). Here the statement is compiled
once to the driver's own SQL and sent on a connection of the same pool, in autocommit (one
round trip, atomic on its own), with the pool's checks on the way out (the checkout ping of
``storage.engine``) and its reset on the way back.

What the caller sees does not change: the first row (its columns by name) or ``None``, and a
driver error comes back as the SQLAlchemy error ``Connection.execute`` raises for it
(``OperationalError`` for a connection lost), the pooled connection thrown away where the
error says it is gone. So the retries of a write, and what counts as the store failing
(``errors.is_store_error``, ``worker.attempt.transient``), see no difference.

The pieces shared with SQLite's direct transactions (``storage.direct_sqlite``) live here:
compiling a statement once, the checkout, the check of the parameters given, and the
translation of a driver error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

from sqlalchemy import Engine, Executable
from sqlalchemy.exc import DBAPIError, StatementError

Observer = Callable[[str, Mapping[str, Any]], None]
"""Told each statement sent (its SQL and parameters), before it is sent."""

Compiled = tuple[str, dict[str, Any], frozenset[str]]
"""A statement in the driver's SQL, the values it binds itself, the parameters it wants."""

_Made = TypeVar("_Made")


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


class DirectStatements:
    """Statements sent on a PostgreSQL engine's pooled connections, past SQLAlchemy's
    execution machinery (see the module doc)."""

    def __init__(self, engine: Engine) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError("direct statements are for PostgreSQL (psycopg) engines")
        self.engine = engine
        self.observers: list[Observer] = []
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
            observe(sql, params)
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
