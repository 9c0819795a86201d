"""A turn appended to its session as one statement on PostgreSQL, run in autocommit
(``SqlStorage.write_at_once``, sent by ``storage.driver``).

Through psycopg a transaction waits for the server at its ``BEGIN``, at each statement and at
its ``COMMIT``; a statement on its own is atomic already and waits once. A turn's append was a
transaction of two statements (the session's count-in, then its messages), four waits; here it
is one statement whose ``WITH`` part counts the turn in and whose insert places the messages
after the count it returns. The same two parts end a queued run's ending
(``worker.fenced_statements``), fed by the run's row instead of a session id.

A turn's rows always travel as JSON (``storage.bulk.json_rows``: their text is made storable
before, their other values are numbers and ``None``). On SQLite, where a statement costs no
round trip, a turn is the two statements of ``storage.sql.count_in_turn``.

The trail's written-behind records stay in a transaction of their own: the writer retries a
failed write, and a statement whose reply was lost after PostgreSQL committed it (a connection
reset mid-statement) would store the burst twice; a transaction leaves that window only to
its ``COMMIT``'s reply. Nothing retries an append.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import TextClause, text

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


def turn_statement(
    quote: Quote, session_id: str, rows: Sequence[dict[str, Any]], now: int
) -> tuple[TextClause, dict[str, Any]]:
    """The one statement that appends a turn's ``messages`` rows (``storage.sql.message_rows``
    made them storable, so they always travel as JSON) to the session on PostgreSQL, and its
    parameters: sent alone in autocommit, or inside a transaction of the caller's."""
    bound = turn_parameters(rows, now)
    if bound is None:  # a defect: message rows are text, numbers and None
        raise ValueError("a turn's messages cannot travel as JSON")
    return _append_statement(quote), {**bound, "p_session_id": session_id}


@functools.lru_cache(maxsize=4)
def _append_statement(quote: Quote) -> TextClause:
    given = "(SELECT CAST(:p_session_id AS text) AS session_id) AS given"
    return text(f"WITH {', '.join(turn_parts(quote, given))} SELECT 1")
