"""Every statement the store writes its records with: one builder per logical record, its
PostgreSQL and SQLite forms side by side, each sent by ``storage.driver`` (``Driver.write``
takes a ``Write``: one statement sent alone, or steps in a transaction). A form inside a
larger statement is the same builder's, composed (a part of a ``WITH``), never a second text.

=======================  =============================================  =========================
record                   PostgreSQL                                     SQLite
=======================  =============================================  =========================
a session's turn         one ``WITH`` statement (``turn_parts``: the    the count-in, then the
                         count-in and the messages), alone or composed  messages (``count_in_turn``)
rows of a table (a       ``INSERT … SELECT … FROM json_populate_        ``INSERT`` sent once per row
trail batch, journal     recordset`` (``rows_part``), alone or a part   (``executemany``)
entries, a run's events  of a fenced statement
numbered by its holder)
a run's next event       ``NEXT_EVENT`` (``next_event_part``): numbered after the latest, the same
                         text on both; alone, or a part of a run's ending fed by its fence
a run's ending by its    one ``WITH`` statement fenced by its ``held``  the fence, the batch, the
lease holder (answered,  part (``finish_statement``: the answer's      turn, ``LAST_RECORD`` or
or stopped)              record, or a ``stopped`` one)                  the stopped record, the
                                                                        event, ``END_RUN``
a model turn's batch     one ``WITH`` statement (``batch_statement``)   the fence, then the rows
a lease's heartbeat      ``HEARTBEAT`` (the lock taken first)           one ``UPDATE``
=======================  =============================================  =========================

Why one statement on PostgreSQL: through psycopg a transaction waits for the server at its
``BEGIN``, at each statement and at its ``COMMIT``; a statement on its own is atomic already and
waits once. On SQLite, in the process, a statement costs no round trip.

Rows travel to PostgreSQL as one JSON array in one parameter of a statement whose text never
changes (the server keeps it prepared), whatever their number: an ``executemany`` costs one
protocol exchange per row. A value is written into the JSON as PostgreSQL's conversion reads
back what a parameter would have stored (``rows_json``): a boolean in a column of integers as
its number, a whole float in one as the integer, a float that is not finite as the text
PostgreSQL reads it from. A value that cannot go so (another type, a fraction for an integer)
is a defect, refused before anything is sent. Text is storable before it gets here
(``audit.redaction.storable``).

Fenced statements (``held``: the run's row, locked, only while the writer's token is the
lease's and the run is running; each part takes its rows only if ``held`` has the row, so a
copy of the run that lost its lease writes nothing, and the statement says so). Under
``READ COMMITTED`` a row locked by another transaction is read again, as committed, once that
lock goes, so a lease taken over meanwhile is seen. Only that row is read again: the parts of
one statement otherwise see the database as it was when the statement began, and not one
another's rows. So the numbers read there (the trail's latest record, the latest event) are as
of the statement's start, which is safe because whatever else writes a running run's events
or trail changes its status or its token in the transaction that holds the row (a cancel, a
takeover), and ``held`` is then empty. Where a statement by statement version read what an
earlier statement wrote, the values are passed instead: the answer's record is numbered after
the batch's by the caller (``p_wanted``), and the turn's messages follow the session's count as
the session's upsert returns it.

In autocommit a statement whose reply is lost (a connection reset) may have committed, where a
transaction leaves that only to its ``COMMIT``'s reply; so a batch retried after one stores
nothing twice (journal entries replace theirs, an event whose number the run has is left out,
and a fenced trail record whose number the run has is left out), and an ending retried finds
the run ended.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy import (
    BindParameter,
    Boolean,
    Connection,
    Executable,
    Float,
    Insert,
    Integer,
    Table,
    TextClause,
    bindparam,
    case,
    func,
    insert,
    literal_column,
    select,
    text,
    update,
)

from hermes_agent.storage.schema import (
    audit_table,
    events_table,
    journal_table,
    messages_table,
    runs_table,
    sessions_table,
)

Quote = Callable[[str], str]
"""The dialect's quoting of a name (it quotes one only where it must be)."""

_T = TypeVar("_T")

FINISHED = ("completed", "failed", "dead", "cancelled", "timed_out")
"""The statuses that end a run."""

POSTGRESQL_NOW = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000000 AS BIGINT)"
"""The store's clock on PostgreSQL, in ns since the epoch, read when the statement runs."""


class Transaction(Protocol):
    """The statements of one ``Driver.transaction``: what a record's steps are sent with."""

    dialect: str
    """The database's dialect name (``postgresql``, ``sqlite``)."""

    def scalar(self, statement: Executable, params: Mapping[str, Any]) -> Any:
        """Send ``statement`` with ``params``; the first column of its first row, or ``None``."""
        ...

    def insert_many(self, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert ``rows`` (mappings with the same keys) into ``table``, in its database's
        one form of a table's rows."""
        ...


@dataclass(frozen=True, slots=True)
class Write(Generic[_T]):
    """A record's write on one database, as ``Driver.write`` sends it: one ``statement``
    alone (its first row given to ``read``), or ``steps`` in a write transaction of the
    driver's (``Transaction``), or ``core`` steps on a SQLAlchemy ``Connection`` in one."""

    statement: Executable | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    read: Callable[[Any], _T] | None = None
    steps: Callable[[Transaction], _T] | None = None
    core: Callable[[Connection], _T] | None = None


# -- rows of a table --------------------------------------------------------------------------

_PARTS = {audit_table.name: "records", journal_table.name: "journal", events_table.name: "events"}
"""The name a table's rows take in a statement (its part, its parameter ``p_<name>``)."""

KEYS: dict[str, tuple[str, ...]] = {journal_table.name: ("request_id", "key")}
"""The tables whose rows replace those of the same key (``ON CONFLICT … DO UPDATE``)."""


def rows_json(table: Table, rows: Sequence[Mapping[str, Any]]) -> str:
    """``rows`` (mappings with the same keys, at least one) as the JSON array PostgreSQL's
    ``json_populate_recordset(NULL::table, …)`` reads back as the values a parameter would
    store (see the module); a ``ValueError`` for a value that cannot go so."""
    kinds, fractional = _kinds(table, tuple(rows[0]))
    plain = _PLAIN
    for row in rows:
        for name, value in row.items():
            kind = type(value)
            # A str enum (a stage, a role) is plain too: JSON writes its text.
            if kind in plain or (kind is float and name in fractional) or isinstance(value, str):
                continue
            return _converted(table, rows, kinds)
    try:
        return json.dumps(rows, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a float that is not finite: JSON has no number for it
        return _converted(table, rows, kinds)


_PLAIN = frozenset({str, int, type(None)})
"""The types whose values PostgreSQL's JSON conversion reads as it reads a parameter, in any
column (``bool`` is not among them: ``type(True)`` is ``bool``, not ``int``); a ``float``
only in a column of floats."""


def _converted(table: Table, rows: Sequence[Mapping[str, Any]], kinds: Mapping[str, str]) -> str:
    """The rows with each value written as PostgreSQL reads back what a parameter stores."""
    converted = [
        {name: _plain(value, kinds[name], table.name, name) for name, value in row.items()}
        for row in rows
    ]
    return json.dumps(converted, ensure_ascii=False, allow_nan=False)


_WHOLE, _FRACTIONAL, _BOOLEAN, _TEXT = "whole", "fractional", "boolean", "text"


@functools.lru_cache(maxsize=256)
def _kinds(table: Table, columns: tuple[str, ...]) -> tuple[dict[str, str], frozenset[str]]:
    """What each of ``columns`` holds, and which hold floats; a ``ValueError`` for a column
    that is not the table's, or where one left out has a default SQLAlchemy would fill in (a
    text statement applies none; what the server fills in, a serial id, it fills in either
    way)."""
    unknown = set(columns) - set(table.c.keys())
    if unknown:
        raise ValueError(f"{table.name} has no columns {sorted(unknown)}")
    if any(column.default is not None for column in table.c if column.name not in columns):
        raise ValueError(f"rows of {table.name} leave out a column with a default")
    kinds: dict[str, str] = {}
    for name in columns:
        kind = table.c[name].type
        kinds[name] = (
            _FRACTIONAL
            if isinstance(kind, Float)
            else _BOOLEAN
            if isinstance(kind, Boolean)
            else _WHOLE
            if isinstance(kind, Integer)
            else _TEXT
        )
    return kinds, frozenset(name for name in columns if kinds[name] == _FRACTIONAL)


def _plain(value: Any, kind: str, table: str, name: str) -> Any:
    kind_of = type(value)
    if value is None or kind_of is str or kind_of is int:
        return value
    if isinstance(value, str):  # a str enum (a stage, a role): its text
        return str(value)
    if kind_of is bool:
        return value if kind == _BOOLEAN else int(value)
    if kind_of is float:
        if kind == _FRACTIONAL:
            return value if math.isfinite(value) else str(value).replace("inf", "Infinity")
        if kind == _WHOLE and value.is_integer():
            return int(value)
    raise ValueError(f"a value of {table}.{name} ({kind_of.__name__}) cannot travel as JSON")


def rows_part(quote: Quote, table: Table, columns: tuple[str, ...], fenced: bool = False) -> str:
    """The PostgreSQL statement for rows of ``columns`` (``:p_<name>``, their JSON), alone or,
    ``fenced``, a ``WITH`` part of a fenced statement: its rows are taken only if ``held``
    holds the run's row, and a trail record whose number the run has is left out."""
    name, listed = quote(table.name), ", ".join(quote(c) for c in columns)
    part = _PARTS.get(table.name, "rows")
    sql = (
        f"INSERT INTO {name} ({listed}) SELECT {', '.join('x.' + quote(c) for c in columns)} "
        f"FROM json_populate_recordset(NULL::{name}, CAST(:p_{part} AS json)) AS x"
    )
    if fenced:
        sql += " WHERE EXISTS (SELECT 1 FROM held)"
        if table is audit_table:  # the trail has no unique key on its numbers
            sql += (
                f" AND NOT EXISTS (SELECT 1 FROM {name} AS stored "
                # The run's id as the parameter, not the row's: the planner then reads the
                # run's own records by their index, not the whole trail.
                "WHERE stored.request_id = :p_request_id AND stored.seq = x.seq)"
            )
    keys = KEYS.get(table.name, ())
    if keys:
        changed = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in columns if c not in keys)
        sql += f" ON CONFLICT ({', '.join(quote(k) for k in keys)}) DO UPDATE SET {changed}"
    elif table is events_table:
        sql += " ON CONFLICT (request_id, seq) DO NOTHING"
    return f"{part} AS ({sql})" if fenced else sql


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (mappings with the same keys) into ``table`` inside the caller's
    transaction, in its database's one form (see the module); rows of a table with ``KEYS``
    replace those of the same key, and of rows with one key the last given is stored."""
    if not rows:
        return
    columns, keys = tuple(rows[0]), KEYS.get(table.name, ())
    if keys:  # one statement may not change a row twice: the last of each key stays
        rows = list({tuple(row[k] for k in keys): row for row in rows}.values())
    if conn.dialect.name == "postgresql":
        quote = conn.dialect.identifier_preparer.quote
        part = _PARTS.get(table.name, "rows")
        conn.execute(_alone(quote, table, columns), {f"p_{part}": rows_json(table, rows)})
        return
    conn.execute(row_by_row(table, columns), [dict(row) for row in rows])


@functools.lru_cache(maxsize=256)
def _alone(quote: Quote, table: Table, columns: tuple[str, ...]) -> TextClause:
    return text(rows_part(quote, table, columns))


@functools.lru_cache(maxsize=256)
def row_by_row(table: Table, columns: tuple[str, ...]) -> Insert:
    """SQLite's statement for rows of ``columns``, sent once per row (built once)."""
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    keys = KEYS.get(table.name, ())
    if not keys:
        return insert(table)
    statement = sqlite_insert(table)
    changed = {c: statement.excluded[c] for c in columns if c not in keys}
    return statement.on_conflict_do_update(index_elements=list(keys), set_=changed)


def dialect_insert(dialect: str) -> Any:
    """The ``insert`` of ``dialect``'s SQLAlchemy module (the one with ``ON CONFLICT``)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert


# -- a session's turn -------------------------------------------------------------------------


def turn_parameters(rows: Sequence[Mapping[str, Any]], now: int) -> dict[str, Any]:
    """The parameters of ``turn_parts`` for a turn's ``messages`` rows (at least one,
    numbered from 0 in the turn)."""
    return {
        "p_messages": rows_json(messages_table, rows),
        "p_added": len(rows),
        "p_users": sum(1 for row in rows if row["role"] == "user"),
        "p_now": now,
    }


def turn_parts(quote: Quote, session_from: str) -> list[str]:
    """PostgreSQL: two ``WITH`` parts that append a turn to a session: ``counted`` creates
    the session or counts the turn in, returning its message count (the row stays locked to
    the commit, so two writers of one session take turns), and ``turn`` inserts the messages
    after what the session held. ``session_from``: what follows ``FROM`` to give the session's
    id as ``session_id`` (no row: no turn is appended)."""
    sessions, messages = quote(sessions_table.name), quote(messages_table.name)
    columns = [c.name for c in messages_table.c if c.name not in ("session_id", "position")]
    return [
        f"counted AS (INSERT INTO {sessions} (id, created_ns, updated_ns, turns, messages) "
        f"SELECT session_id, :p_now, :p_now, :p_users, :p_added FROM {session_from} "
        "ON CONFLICT (id) DO UPDATE SET updated_ns = excluded.updated_ns, "
        f"messages = {sessions}.messages + excluded.messages, "
        f"turns = {sessions}.turns + excluded.turns RETURNING id, messages)",
        f"turn AS (INSERT INTO {messages} (session_id, position, "
        f"{', '.join(quote(c) for c in columns)}) "
        "SELECT counted.id, counted.messages - :p_added + x.position, "
        f"{', '.join('x.' + quote(c) for c in columns)} "
        "FROM counted, "
        f"json_populate_recordset(NULL::{messages}, CAST(:p_messages AS json)) AS x)",
    ]


@functools.lru_cache(maxsize=4)
def turn_statement(quote: Quote) -> TextClause:
    """PostgreSQL: the turn appended to the session ``:p_session_id``, one statement."""
    given = "(SELECT CAST(:p_session_id AS text) AS session_id) AS given"
    return text(f"WITH {', '.join(turn_parts(quote, given))} SELECT 1")


def count_in_turn(
    tx: Transaction, session_id: str, rows: Sequence[dict[str, Any]], now: int
) -> None:
    """SQLite: a turn's ``messages`` rows (in order; placed here, in place) appended to a
    session in a transaction: one statement creates the session or counts the turn in and
    says where the turn starts (it takes SQLite's write lock to the commit, so two processes
    appending to one session take turns), then the messages are inserted there."""
    added = len(rows)
    users = sum(1 for row in rows if row["role"] == "user")
    bound = {"p_id": session_id, "p_now": now, "p_added": added, "p_users": users}
    start = int(tx.scalar(_count_in_statement(tx.dialect), bound)) - added
    for index, row in enumerate(rows):
        row["session_id"], row["position"] = session_id, start + index
    tx.insert_many(messages_table, rows)


@functools.cache
def _count_in_statement(dialect: str) -> Any:
    """Create the session, or count a turn in, returning its message count (built once per
    dialect: building a statement costs more than running it)."""
    s = sessions_table.c
    now: BindParameter[Any] = bindparam("p_now")
    added: BindParameter[Any] = bindparam("p_added")
    users: BindParameter[Any] = bindparam("p_users")
    counted = dialect_insert(dialect)(sessions_table).values(
        id=bindparam("p_id"), created_ns=now, updated_ns=now, turns=users, messages=added
    )
    return counted.on_conflict_do_update(
        index_elements=[s.id],
        set_={"updated_ns": now, "messages": s.messages + added, "turns": s.turns + users},
    ).returning(s.messages)


def turn_write(
    dialect: str, quote: Quote, session_id: str, rows: Sequence[dict[str, Any]], now: int
) -> Write[None]:
    """A turn's ``messages`` rows (numbered from 0) appended to a session, alone."""
    if dialect == "postgresql":
        bound = {**turn_parameters(rows, now), "p_session_id": session_id}
        return Write(statement=turn_statement(quote), params=bound, read=_nothing)
    return Write(steps=lambda tx: count_in_turn(tx, session_id, rows, now))


def append_turn(
    tx: Transaction, quote: Quote, session_id: str, rows: Sequence[dict[str, Any]], now: int
) -> None:
    """The same turn inside the caller's transaction (a queued run's fenced one)."""
    if tx.dialect == "postgresql":
        tx.scalar(turn_statement(quote), {**turn_parameters(rows, now), "p_session_id": session_id})
    else:
        count_in_turn(tx, session_id, rows, now)


def _nothing(_row: Any) -> None:
    return None


# -- a run's next event -----------------------------------------------------------------------


def next_event_part(quote: Quote, source: str) -> str:
    """An event (``:p_event``) numbered after the run's latest, for the run whose id
    ``source`` (what follows ``FROM``) gives as ``request_id``; the same text on both
    databases. The caller's transaction holds the run's row (its event writers take turns)."""
    events = quote(events_table.name)
    return (
        f"INSERT INTO {events} (request_id, seq, payload) SELECT request_id, "
        f"COALESCE((SELECT max(seq) FROM {events} WHERE request_id = :p_request_id), 0) + 1, "
        f"CAST(:p_event AS text) FROM {source}"
    )


NEXT_EVENT = text(
    next_event_part(
        lambda name: name, "(SELECT CAST(:p_request_id AS text) AS request_id) AS given"
    )
    + " RETURNING seq"
)
"""A run's next event alone (its number returned), inside the caller's transaction."""

LOCK_RUN = (
    select(runs_table.c.request_id)
    .where(runs_table.c.request_id == bindparam("p_request_id"))
    .with_for_update()
)
"""The run's row, held to the commit: what orders its event writers."""


# -- a run's ending and its fence -------------------------------------------------------------


def held_part(quote: Quote) -> str:
    """PostgreSQL: the fence, the run's row locked only while the token is the lease's."""
    r = quote(runs_table.name)
    return (
        f"held AS (SELECT request_id, session_id, turn_saved FROM {r} "
        "WHERE request_id = :p_request_id AND lease_token = :p_token AND status = 'running' "
        "FOR UPDATE)"
    )


Parts = tuple[tuple[Table, tuple[str, ...]], ...]
"""A batch's tables that have rows, each with the columns its rows give."""


def batch_parameters(
    tables: Sequence[tuple[Table, Sequence[Mapping[str, Any]]]],
) -> tuple[Parts, dict[str, Any]]:
    """Which of a batch's tables have rows (and their columns), and their parameters."""
    names: list[tuple[Table, tuple[str, ...]]] = []
    bound: dict[str, Any] = {}
    for table, rows in tables:
        if not rows:
            continue
        keys = KEYS.get(table.name, ())
        if keys:
            rows = list({tuple(row[k] for k in keys): row for row in rows}.values())
        names.append((table, tuple(rows[0])))
        bound[f"p_{_PARTS[table.name]}"] = rows_json(table, rows)
    return tuple(names), bound


@functools.lru_cache(maxsize=32)
def batch_statement(quote: Quote, names: Parts, renew: bool = False) -> TextClause:
    """PostgreSQL: a model turn's batch fenced by ``held``, built once per set of tables;
    ``renew``: the lease is extended by ``:p_ttl_ns`` from the moment the statement runs."""
    parts = [held_part(quote), *(rows_part(quote, table, cols, True) for table, cols in names)]
    if renew:
        runs = quote(runs_table.name)
        parts.append(
            f"renewed AS (UPDATE {runs} SET lease_expires_ns = {POSTGRESQL_NOW} + :p_ttl_ns, "
            f"heartbeat_ns = {POSTGRESQL_NOW} FROM held WHERE {runs}.request_id = held.request_id)"
        )
    return text(f"WITH {', '.join(parts)} SELECT (SELECT count(*) FROM held) AS held")


STOPPED_FROM_LATEST = ("request_id", "session_id", "step", "model_name", "system_prompt_sha256")
"""The columns of a ``stopped`` ending that come from the run (its row, its latest record),
not from the record the caller gives."""


@functools.lru_cache(maxsize=64)
def finish_statement(
    quote: Quote,
    names: Parts,
    recorded: tuple[str, ...],
    has_turn: bool,
    single_event: bool,
    stopped: bool = False,
) -> TextClause:
    """PostgreSQL: a run's ending fenced by ``held``, built once per shape: its batch, its
    trail's ending (``recorded``: the columns of ``:p_last``, the record given, but its
    number; none: no record), its last event, its turn and its row. The trail's ending is
    numbered after every record the trail holds and ``:p_wanted``; a ``stopped`` one
    (``stopped``) takes its step, model and prompt digest from the trail's latest record
    unless the batch's last (``:p_step``, ``:p_model``, ``:p_sha``) comes after it, as a
    record made from the latest one read back would."""
    parts = [held_part(quote), *(rows_part(quote, table, cols, True) for table, cols in names)]
    audit = quote(audit_table.name)
    listed = ", ".join(quote(c) for c in recorded)
    taken = ", ".join("x." + quote(c) for c in recorded)
    seq = (
        "CASE WHEN latest.seq >= CAST(:p_wanted AS integer) THEN latest.seq + 1 "
        "ELSE CAST(:p_wanted AS integer) END"
    )
    records = f"json_populate_recordset(NULL::{audit}, CAST(:p_last AS json)) AS x"
    if recorded and not stopped:
        parts.append(
            f"answer AS (INSERT INTO {audit} ({listed}, seq) SELECT {taken}, {seq} "
            f"FROM {records}, "
            f"(SELECT max(seq) AS seq FROM {audit} WHERE request_id = :p_request_id) AS latest "
            "WHERE EXISTS (SELECT 1 FROM held))"
        )
    elif recorded:
        latest = "(CAST(:p_step AS integer) IS NULL OR latest.seq >= CAST(:p_wanted AS integer))"
        parts.append(
            f"stopped AS (INSERT INTO {audit} ({listed}, "
            f"{', '.join(quote(c) for c in STOPPED_FROM_LATEST)}, seq) "
            f"SELECT {taken}, held.request_id, held.session_id, "
            f"CASE WHEN {latest} THEN COALESCE(latest.step, 0) "
            "ELSE CAST(:p_step AS integer) END, "
            f"CASE WHEN {latest} THEN COALESCE(latest.model_name, '') "
            "ELSE CAST(:p_model AS text) END, "
            f"CASE WHEN {latest} THEN COALESCE(latest.system_prompt_sha256, '') "
            f"ELSE CAST(:p_sha AS text) END, {seq} "
            f"FROM {records}, held LEFT JOIN (SELECT step, model_name, system_prompt_sha256, "
            f"seq FROM {audit} WHERE request_id = :p_request_id ORDER BY seq DESC LIMIT 1) "
            "AS latest ON true)"
        )
    if single_event:
        parts.append(f"last_event AS ({next_event_part(quote, 'held')})")
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


def _last_record_statement() -> Insert:
    """SQLite: the trail's ending, numbered after every record the trail holds, in one
    statement: the latest number is read by a subquery of the insert."""
    from hermes_agent.audit.records import RECORD_FIELDS

    a = audit_table.c
    latest = (
        select(func.max(a.seq)).where(a.request_id == bindparam("p_request_id")).scalar_subquery()
    )
    wanted = bindparam("p_seq", type_=Integer)
    values: dict[str, Any] = {
        name: bindparam(f"p_{name}") for name in RECORD_FIELDS if name != "seq"
    }
    return insert(audit_table).values(
        **values, seq=case((latest >= wanted, latest + 1), else_=wanted)
    )


LAST_RECORD = _last_record_statement()

RUN_ROW = (
    select(
        runs_table.c.lease_token,
        runs_table.c.status,
        runs_table.c.session_id,
        runs_table.c.turn_saved,
    )
    .where(runs_table.c.request_id == bindparam("p_request_id"))
    .with_for_update()
)
"""The run's row, held for the transaction: its fence (the token, the status), and what its
ending reads."""

LAST_OF_TRAIL = (
    select(audit_table)
    .where(audit_table.c.request_id == bindparam("p_request_id"))
    .order_by(audit_table.c.seq.desc())
    .limit(1)
)
"""The run's latest trail record (a ``stopped`` ending is numbered after it)."""


def _end_run_statement() -> Any:
    """The run's row ended, returning the session's next run if it is parked waiting for
    this one: the oldest other unfinished run of the session. Whether the subquery sees the
    run's own row as it was or as updated differs by database, so the run is left out by its
    id."""
    r = runs_table.c
    other = runs_table.alias("other")
    o = other.c
    request_id: BindParameter[Any] = bindparam("p_request_id")
    following = (
        select(case((o.parked, o.request_id), else_=None))
        # The ended row's column named with its table: SQLite writes the columns of an
        # UPDATE's RETURNING bare (as in the claim's).
        .where(
            o.session_id == literal_column(f"{runs_table.name}.session_id"),
            o.request_id != request_id,
            o.status.not_in([literal_column(f"'{s}'") for s in FINISHED]),
        )
        .order_by(o.created_ns, o.request_id)
        .limit(1)
        .scalar_subquery()
    )
    return (
        update(runs_table)
        .where(r.request_id == request_id)
        .values(
            status=bindparam("p_status"),
            updated_ns=bindparam("p_now"),
            lease_owner=None,
            lease_expires_ns=None,
            result=bindparam("p_result"),
            error=bindparam("p_error"),
            turn_saved=bindparam("p_turn_saved"),
        )
        .returning(following.label("following"))
    )


END_RUN = _end_run_statement()


# -- a lease's heartbeat ----------------------------------------------------------------------

# PostgreSQL computes an UPDATE's new values before it waits for the row's lock: the lock is
# taken first (``held``), so that the clock is read once the lease's holder has the row.
HEARTBEAT = text(
    f"WITH held AS (SELECT request_id FROM {runs_table.name} "
    "WHERE request_id = :p_request_id AND lease_token = :p_token AND status = 'running' "
    f"FOR UPDATE) UPDATE {runs_table.name} SET lease_expires_ns = {POSTGRESQL_NOW} + :p_ttl_ns, "
    f"heartbeat_ns = {POSTGRESQL_NOW} FROM held "
    f"WHERE {runs_table.name}.request_id = held.request_id RETURNING 1"
)
"""PostgreSQL: a lease extended from the store's clock, fenced by its token."""
