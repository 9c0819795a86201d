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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Engine, Executable
from sqlalchemy.exc import DBAPIError

Observer = Callable[[str, Mapping[str, Any]], None]
"""Told each statement sent (its SQL and parameters), before it is sent."""

Compiled = tuple[str, dict[str, Any], frozenset[str]]
"""A statement in the driver's SQL, the values it binds itself, the parameters it wants."""


class DirectStatements:
    """Statements sent on a PostgreSQL engine's pooled connections, past SQLAlchemy's
    execution machinery (see the module doc)."""

    def __init__(self, engine: Engine) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError("direct statements are for PostgreSQL (psycopg) engines")
        self.engine = engine
        self.observers: list[Observer] = []
        self._compiled: dict[int, tuple[Executable, Compiled]] = {}
        self._guard = threading.Lock()

    def sql(self, statement: Executable) -> Compiled:
        """``statement`` in the driver's own SQL (its parameters ``%(name)s``), compiled once;
        the values it binds itself (a Core statement's literals); and the names of those the
        caller must give. For a text statement, or a Core one whose parameters need no
        conversion by SQLAlchemy (text, numbers, booleans, ``None``)."""
        found = self._compiled.get(id(statement))
        if found is not None and found[0] is statement:
            return found[1]
        compiled = statement.compile(  # type: ignore[attr-defined]
            dialect=self.engine.dialect, compile_kwargs={"render_postcompile": True}
        )
        if compiled.escaped_bind_names:  # the SQL's names would not be the caller's
            raise ValueError("a direct statement's parameters are named as plain identifiers")
        wanted = frozenset(name for name, bind in compiled.binds.items() if bind.required)
        own = {name: value for name, value in compiled.params.items() if name not in wanted}
        made: Compiled = (str(compiled), own, wanted)
        with self._guard:
            if len(self._compiled) > 512:  # statements are built once each: this is a bound
                self._compiled.clear()
            # The statement is kept with its SQL, so that its id is not reused meanwhile.
            self._compiled[id(statement)] = (statement, made)
        return made

    def first(self, statement: Executable, params: Mapping[str, Any]) -> Any | None:
        """Send ``statement`` in autocommit with ``params`` (every parameter it does not bind
        itself); its first row (columns as attributes: the statement names them as Python
        identifiers), or ``None`` when it returns none."""
        from psycopg.rows import namedtuple_row

        sql, own, wanted = self.sql(statement)
        if own:
            params = {**own, **params}
        missing = wanted.difference(params)
        if missing:  # a defect of the caller, not the store failing: never retried
            raise ValueError(f"no value for the statement's parameters {sorted(missing)}")
        for observe in self.observers:
            observe(sql, params)
        dbapi = self.engine.dialect.loaded_dbapi
        try:
            fairy = self.engine.raw_connection()  # the pool's checkout, and its ping
        except dbapi.Error as exc:  # no connection to be had: the store is away
            raise DBAPIError.instance(
                None,
                None,
                exc,
                dbapi.Error,
                connection_invalidated=self.engine.dialect.is_disconnect(exc, None, None),
                dialect=self.engine.dialect,
            ) from exc
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
            raise DBAPIError.instance(
                sql,
                dict(params),
                exc,
                dbapi.Error,
                hide_parameters=True,
                connection_invalidated=gone,
                dialect=self.engine.dialect,
            ) from exc
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
