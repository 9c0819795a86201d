"""A turn appended to its session as one statement on PostgreSQL, run in autocommit
(``SqlStorage.write_at_once``, straight on the driver's connection: ``storage.direct``).

Through psycopg a transaction waits for the server at its ``BEGIN``, at each statement and at
its ``COMMIT``; a statement on its own is atomic already and waits once. A turn's append was a
transaction of two statements (the session's count-in, then its messages), four waits; here it
is one statement whose ``WITH`` part counts the turn in and whose insert places the messages
after the count it returns. The same two parts end a queued run's ending
(``worker.fenced_statements``), fed by the run's row instead of a session id.

Only where the rows travel as JSON (``storage.bulk.json_rows``); otherwise the caller writes
them in a transaction, as on SQLite, where a statement costs no round trip.

The trail's written-behind records stay in a transaction of their own: the writer retries a
failed write, and a statement whose reply was lost after PostgreSQL committed it (a connection
reset mid-statement) would store the burst twice; a transaction leaves that window only to
its ``COMMIT``'s reply. Nothing retries an append.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Executable, TextClause, text

from hermes_agent.storage.bulk import json_rows
from hermes_agent.storage.schema import messages_table, sessions_table

Quote = Callable[[str], str]


def turn_parameters(rows: Sequence[dict[str, Any]], now: int) -> dict[str, Any] | None:
    """The parameters of ``turn_parts`` for a turn's ``messages`` rows (``storage.sql.
    message_rows``'s, at least one, numbered from 0 in the turn), or ``None`` where they cannot
    travel as JSON."""
    payload = json_rows(messages_table, rows)
    if payload is None:
        return None
    return {
        "p_messages": payload,
        "p_added": len(rows),
        "p_users": sum(1 for row in rows if row["role"] == "user"),
        "p_now": now,
    }


def turn_parts(quote: Quote, session_from: str) -> list[str]:
    """Two ``WITH`` parts that append a turn to a session: ``counted`` creates the session or
    counts the turn in, returning its message count (the row stays locked to the commit, so
    two writers of one session take turns), and ``turn`` inserts the messages after what the
    session held. ``session_from``: what follows ``FROM`` to give the session's id as
    ``session_id`` (no row: no turn is appended)."""
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


def append_turn(
    write: Callable[[Executable, dict[str, Any]], Any],
    quote: Quote,
    session_id: str,
    rows: Sequence[dict[str, Any]],
    now: int,
) -> bool:
    """Append a turn's ``messages`` rows (see ``turn_parameters``) to the session in one
    statement, sent by ``write`` (``SqlStorage.write_at_once``); ``False`` (nothing written)
    where they cannot travel as JSON."""
    bound = turn_parameters(rows, now)
    if bound is None:
        return False
    write(_append_statement(quote), {**bound, "p_session_id": session_id})
    return True


@functools.lru_cache(maxsize=4)
def _append_statement(quote: Quote) -> TextClause:
    given = "(SELECT CAST(:p_session_id AS text) AS session_id) AS given"
    return text(f"WITH {', '.join(turn_parts(quote, given))} SELECT 1")
