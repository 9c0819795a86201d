"""The fence a tool puts on its own effect, when the effect is a write to the runs' store.

A worker frozen inside a tool call (a paused VM, a long GC pause, a ``SIGSTOP``) wakes up inside
it, after its lease may have passed to another worker, which told the model the call was
interrupted (or ran it again). Python cannot stop the tool from going on, so the tool checks,
in the transaction of its effect, that its attempt still holds the run::

    from hermes_agent.worker import fence

    @tool
    def pay(order: str, cents: int) -> str:
        with engine.begin() as conn:      # the same database as the runs' store
            fence(conn)                   # FencedOut: nothing is written
            conn.execute(insert(payments).values(order=order, cents=cents))
        return "paid"

``fence`` reads the run's row (``FENCE_SQL``) and holds it until the transaction ends, so no
other worker can take the run over between the check and the commit: the effect lands only
while the attempt's token is the run's current one. In process (no lease, no token) it checks
nothing.
"""

from __future__ import annotations

import sys
from typing import Any

from hermes_agent.errors import HermesAgentError
from hermes_agent.pipeline.journal import CallKey, current_call

FENCE_SQL = (
    "SELECT lease_token FROM hermes_runs "
    "WHERE request_id = :request_id AND lease_token = :token AND status = 'running'"
)
"""The check, for a tool that writes its own SQL: one row while the attempt holds the run.
On PostgreSQL add ``FOR SHARE``, so that a takeover waits for the effect's commit; on SQLite
open the transaction with ``BEGIN IMMEDIATE`` (the write lock is the row lock there)."""


class FencedOut(HermesAgentError):
    """The attempt running this tool call no longer holds its run (its lease passed to another
    worker, or the run ended): the effect must not be written."""


def fence(connection: Any, call: CallKey | None = None) -> None:
    """Check, inside ``connection``'s open transaction on the runs' store, that the attempt
    running ``call`` (the current tool call by default) still holds its run, and hold the
    run's row until that transaction ends; ``FencedOut`` otherwise (roll back).

    ``connection``: a SQLAlchemy ``Connection`` or ``Session``, or a DB-API connection
    (psycopg, sqlite3). Outside a queued run (in process: no fencing token) nothing is
    checked."""
    call = call if call is not None else current_call()
    if call is None or call.fencing_token is None:
        return
    params = {"request_id": call.request_id, "token": call.fencing_token}
    if _is_sqlalchemy(connection):
        from sqlalchemy import text

        bind = connection.get_bind() if hasattr(connection, "get_bind") else connection
        sql = FENCE_SQL + _lock_clause(bind.dialect.name)
        row = connection.execute(text(sql), params).first()
    else:
        module = type(connection).__module__.split(".")[0]
        sql = _dbapi_sql(FENCE_SQL + _lock_clause(module), _paramstyle(module))
        cursor = connection.cursor()
        try:
            cursor.execute(*sql(params))
            row = cursor.fetchone()
        finally:
            cursor.close()
    if row is None:
        raise FencedOut(
            f"tool call {call.id}: attempt {call.fencing_token} no longer holds run "
            f"{call.request_id} (its lease passed to another worker, or the run ended); "
            "its effect is not written"
        )


def _is_sqlalchemy(connection: Any) -> bool:
    return type(connection).__module__.startswith("sqlalchemy.")


def _lock_clause(dialect: str) -> str:
    return "" if dialect.startswith("sqlite") else " FOR SHARE"


def _paramstyle(module: str) -> str:
    found = sys.modules.get(module)
    return str(getattr(found, "paramstyle", "named"))


def _dbapi_sql(sql: str, style: str) -> Any:
    """``FENCE_SQL`` in the driver's parameter style, with its parameters in order."""
    names = ("request_id", "token")
    if style == "named":
        return lambda p: (sql, p)
    if style == "pyformat":
        for name in names:
            sql = sql.replace(f":{name}", f"%({name})s")
        return lambda p: (sql, p)
    marker = {"qmark": "?", "format": "%s"}.get(style)
    if marker is None:  # numeric
        for index, name in enumerate(names, 1):
            sql = sql.replace(f":{name}", f":{index}")
    else:
        for name in names:
            sql = sql.replace(f":{name}", marker)
    return lambda p: (sql, tuple(p[name] for name in names))
