"""A queued run's fenced writes as one statement each, on PostgreSQL.

A fenced transaction written statement by statement costs a round trip per statement, and two
more for ``BEGIN`` and ``COMMIT``: a model turn's batch five, a run's ending ten. Every one
is a wait of the worker's thread on its socket, and a wake-up of the database's backend. Here
the same writes are one statement with data-modifying ``WITH`` parts, run in autocommit
(``SqlStorage.write_at_once``, sent by ``storage.driver``), so
they cost one round trip and stay atomic:

    WITH held AS (SELECT … FROM hermes_runs
                  WHERE request_id = :id AND lease_token = :token AND status = 'running'
                  FOR UPDATE),
         journal AS (INSERT … SELECT … FROM json_populate_recordset(…)
                     WHERE EXISTS (SELECT 1 FROM held) …),
         …
    SELECT (SELECT count(*) FROM held) AS held, …

The fence is ``held``: the run's row, locked, only while this token is the lease's and the
run is running. Each insert takes its rows only if ``held`` has the row, so a copy of the run
that lost its lease writes nothing, and the statement says so (``held`` is 0; the caller
raises ``LeaseLost``). Under ``READ COMMITTED``, a row locked by another transaction is read
again, as committed, once that lock goes, so a lease taken over meanwhile is seen.

Only that row is read again: the parts of one statement otherwise see the database as it was
when the statement began, and not one another's rows. So the numbers read here (the trail's
latest record, for the answer's; the latest event, for an ending with no batch) are as of the
statement's start, which is safe because whatever else writes a running run's events or
trail changes its status or its token in the transaction that holds the row (a cancel, a
takeover), and ``held`` is then empty. Where the ordered version read what an earlier
statement wrote, the values are passed instead: the answer's record is numbered after the
batch's records by the caller (``wanted``), and the turn's messages follow the session's count
as the session's upsert returns it (``storage.single_statements``).

In autocommit a statement whose reply is lost (a connection reset) may have committed, where
a transaction leaves that only to its ``COMMIT``'s reply; so a batch retried after one stores
nothing twice (``_insert_part``), and an ending retried finds the run ended (``LeaseLost``: the
attempt stops, the run is completed).

Only where every row can travel as JSON (``storage.bulk.json_rows``) and the ending is the
common one (an answer); any other case returns ``None`` and the caller writes it in a
transaction, statement by statement, as on SQLite (where a statement costs no round trip).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import TextClause, text

from hermes_agent.audit.records import AuditRecord
from hermes_agent.storage.bulk import json_rows
from hermes_agent.storage.schema import audit_table, events_table, journal_table, runs_table
from hermes_agent.storage.single_statements import turn_parameters, turn_parts
from hermes_agent.storage.sql import SqlStorage, message_rows
from hermes_agent.types import Message
from hermes_agent.worker.leases import POSTGRESQL_NOW
from hermes_agent.worker.run_rows import FINISHED, Batch, dumps, now_ns
from hermes_agent.worker.run_writes import batch_rows

Quote = Callable[[str], str]


def write_batch_at_once(
    storage: SqlStorage, request_id: str, token: int, batch: Batch, *, renew: float | None = None
) -> bool:
    """``batch`` written in one statement fenced by ``token``: ``True`` written, ``False``
    the lease is not this token's (nothing written). ``renew``: a lease_ttl by which the same
    statement extends the lease, from when it runs."""
    names, bound = _batch_parts(request_id, token, batch, now_ns())
    if renew is not None:
        bound["p_ttl_ns"] = int(renew * 1e9)
    quote = storage.engine.dialect.identifier_preparer.quote
    row = storage.write_at_once(_batch_statement(quote, names, renew is not None), bound)
    assert row is not None  # the statement's one row: whether the fence held
    return bool(row.held)


def finish_at_once(
    storage: SqlStorage,
    request_id: str,
    token: int,
    *,
    result: dict[str, Any] | None,
    error: str | None,
    turn: Sequence[Message] | None,
    output: AuditRecord,
    event: dict[str, Any] | None,
    batch: Batch | None,
) -> tuple[bool, str | None]:
    """A completed run's ending in one statement fenced by ``token`` (what
    ``FencedWrites.finish`` writes for it): ``(held, following)`` — whether the lease was this
    token's (nothing is written otherwise) and the session's next run if it is parked waiting
    for this one."""
    now = now_ns()
    batch = batch if batch is not None else Batch()
    single_event: str | None = None
    if event is not None:
        if batch.events:  # numbered after the holder's own, as the transaction's way does
            ending = (batch.events[-1][0] + 1, event)
            batch = Batch(batch.entries, [*batch.events, ending], batch.records)
        else:
            single_event = dumps(event)
    names, bound = _batch_parts(request_id, token, batch, now)
    last = output.to_dict()
    # Numbered after every record the trail holds, the batch's included: the statement's
    # parts do not see one another's rows, so the batch's numbers are counted in here.
    wanted = max([int(last.pop("seq")), *(r.seq + 1 for r in batch.records)])
    last_rows = _as_json(audit_table, [last])
    bound.update(
        p_last=last_rows,
        p_wanted=wanted,
        p_status="completed",
        p_result=dumps(result) if result is not None else None,
        p_error=error,
        p_has_turn=bool(turn),
    )
    has_turn = bool(turn)
    if turn:
        counted = turn_parameters(message_rows("", 0, turn), now)
        if counted is None:
            raise ValueError("a turn's messages cannot travel as JSON")
        bound.update(counted)
    if single_event is not None:
        bound["p_event"] = single_event
    quote = storage.engine.dialect.identifier_preparer.quote
    statement = _finish_statement(quote, names, tuple(last), has_turn, single_event is not None)
    row = storage.write_at_once(statement, bound)
    assert row is not None  # the statement's one row: the fence, and the session's next run
    return bool(row.held), row.following


# -- the statements ---------------------------------------------------------------------


Parts = tuple[tuple[str, tuple[str, ...]], ...]
"""The batch's tables that have rows, each with the columns its rows give."""


def _batch_parts(
    request_id: str, token: int, batch: Batch, now: int
) -> tuple[Parts, dict[str, Any]]:
    """Which of the batch's tables have rows (and their columns), and the statement's
    parameters."""
    bound: dict[str, Any] = {"p_request_id": request_id, "p_token": token, "p_now": now}
    names: list[tuple[str, tuple[str, ...]]] = []
    entries, events, records = batch_rows(request_id, token, batch, now)
    tables: list[tuple[str, Any, list[dict[str, Any]]]] = [
        ("journal", journal_table, entries),
        ("events", events_table, events),
        ("records", audit_table, records),
    ]
    for name, table, rows in tables:
        if not rows:
            continue
        payload = _as_json(table, rows)
        names.append((name, tuple(rows[0])))
        bound[f"p_{name}"] = payload
    return tuple(names), bound


def _as_json(table: Any, rows: list[dict[str, Any]]) -> str:
    """``rows`` as the JSON the statement takes them in. Every row a run writes travels so (its
    text is made storable before, its other values are numbers and ``None``): one that does
    not is a defect, not a reason to write it another way."""
    payload = json_rows(table, rows)
    if payload is None:
        raise ValueError(f"rows of {table.name} that cannot travel as JSON")
    return payload


_TABLES = {"journal": journal_table, "events": events_table, "records": audit_table}
_REPLACE_ON = {"journal": ("request_id", "key")}


def _held(quote: Quote) -> str:
    r = quote(runs_table.name)
    return (
        f"held AS (SELECT request_id, session_id, turn_saved FROM {r} "
        "WHERE request_id = :p_request_id AND lease_token = :p_token AND status = 'running' "
        "FOR UPDATE)"
    )


def _insert_part(quote: Quote, name: str, columns: tuple[str, ...]) -> str:
    """The batch's rows of one table, taken only if ``held`` holds the run's row. A retry of a
    batch that was stored (its reply lost) stores nothing twice: journal entries replace
    theirs, and an event or a record whose number the run has already is left out (the lease
    holder numbers them, so only that batch can have stored it)."""
    table = quote(_TABLES[name].name)
    listed = ", ".join(quote(c) for c in columns)
    taken = ", ".join("x." + quote(c) for c in columns)
    sql = (
        f"{name} AS (INSERT INTO {table} ({listed}) SELECT {taken} "
        f"FROM json_populate_recordset(NULL::{table}, CAST(:p_{name} AS json)) AS x "
        "WHERE EXISTS (SELECT 1 FROM held)"
    )
    if name == "records":  # the trail has no unique key on its numbers
        sql += (
            f" AND NOT EXISTS (SELECT 1 FROM {table} AS stored "
            # The run's id as the parameter, not the row's: the planner then reads the
            # run's own records by their index, not the whole trail.
            "WHERE stored.request_id = :p_request_id AND stored.seq = x.seq)"
        )
    keys = _REPLACE_ON.get(name, ())
    if keys:
        changed = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in columns if c not in keys)
        sql += f" ON CONFLICT ({', '.join(quote(k) for k in keys)}) DO UPDATE SET {changed}"
    elif name == "events":
        sql += " ON CONFLICT (request_id, seq) DO NOTHING"
    return sql + ")"


@functools.lru_cache(maxsize=32)
def _batch_statement(quote: Quote, names: Parts, renew: bool = False) -> TextClause:
    """Built once per set of tables (the server keeps each prepared); ``renew``: the lease is
    extended by ``:p_ttl_ns`` from the moment the statement runs (the store's clock)."""
    parts = [_held(quote), *(_insert_part(quote, *name) for name in names)]
    if renew:
        runs = quote(runs_table.name)
        parts.append(
            f"renewed AS (UPDATE {runs} SET lease_expires_ns = {POSTGRESQL_NOW} + :p_ttl_ns, "
            f"heartbeat_ns = {POSTGRESQL_NOW} FROM held WHERE {runs}.request_id = held.request_id)"
        )
    return text(f"WITH {', '.join(parts)} SELECT (SELECT count(*) FROM held) AS held")


@functools.lru_cache(maxsize=64)
def _finish_statement(
    quote: Quote, names: Parts, recorded: tuple[str, ...], has_turn: bool, single_event: bool
) -> TextClause:
    """Built once per shape of ending (the server keeps each prepared); ``recorded``: the
    answer's record's columns but its number."""
    parts = [_held(quote), *(_insert_part(quote, *name) for name in names)]
    audit, events = quote(audit_table.name), quote(events_table.name)
    listed = ", ".join(quote(c) for c in recorded)
    parts.append(
        f"answer AS (INSERT INTO {audit} ({listed}, seq) "
        f"SELECT {', '.join('x.' + quote(c) for c in recorded)}, "
        "CASE WHEN latest.seq >= CAST(:p_wanted AS integer) THEN latest.seq + 1 "
        "ELSE CAST(:p_wanted AS integer) END "
        f"FROM json_populate_recordset(NULL::{audit}, CAST(:p_last AS json)) AS x, "
        f"(SELECT max(seq) AS seq FROM {audit} WHERE request_id = :p_request_id) AS latest "
        "WHERE EXISTS (SELECT 1 FROM held))"
    )
    if single_event:
        parts.append(
            f"last_event AS (INSERT INTO {events} (request_id, seq, payload) "
            "SELECT request_id, "
            f"COALESCE((SELECT max(seq) FROM {events} WHERE request_id = :p_request_id), 0) + 1, "
            "CAST(:p_event AS text) FROM held)"
        )
    if has_turn:  # unless an earlier attempt saved it and died before finishing
        parts.extend(turn_parts(quote, "held WHERE NOT turn_saved"))
    runs = quote(runs_table.name)
    finished = ", ".join(f"'{status}'" for status in FINISHED)
    parts.append(
        f"ended AS (UPDATE {runs} SET status = :p_status, updated_ns = :p_now, "
        "lease_owner = NULL, lease_expires_ns = NULL, result = :p_result, error = :p_error, "
        f"turn_saved = ({runs}.turn_saved OR CAST(:p_has_turn AS boolean)) "
        f"FROM held WHERE {runs}.request_id = held.request_id "
        # The session's next run if it is parked waiting for this one: the oldest other
        # unfinished run of the session.
        f"RETURNING (SELECT CASE WHEN other.parked THEN other.request_id END FROM {runs} AS other "
        f"WHERE other.session_id = {runs}.session_id AND other.request_id <> :p_request_id "
        f"AND other.status NOT IN ({finished}) "
        "ORDER BY other.created_ns, other.request_id LIMIT 1) AS following)"
    )
    return text(
        f"WITH {', '.join(parts)} "
        "SELECT (SELECT count(*) FROM held) AS held, (SELECT following FROM ended) AS following"
    )
