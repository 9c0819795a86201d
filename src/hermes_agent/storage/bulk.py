"""Several rows of one table in one statement, whatever their number.

A run writes its rows a few at a time — a turn's messages, a step's trail records, a model
turn's events — and on PostgreSQL an ``executemany`` of them costs one protocol exchange per
row, each with its own parameters to convert, in the client and in the server alike. Here
the rows travel as one JSON array in one parameter of one statement whose text never changes
(so the server keeps it prepared), and the server takes them apart:

    INSERT INTO events (request_id, seq, payload)
    SELECT request_id, seq, payload FROM json_populate_recordset(NULL::events, $1)

``json_populate_recordset`` converts each value to its column's type, as a parameter would
be. Rows hold only JSON's own types (text, integers, finite floats, booleans, ``None``), and
their text is storable already (``audit.redaction.storable``: no NUL, no lone surrogate);
rows JSON cannot carry — a float that is not finite — go by ``executemany``, as every row
does on SQLite, where a statement per row costs no round trip.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Table, TextClause, insert, text


def insert_rows(
    conn: Connection,
    table: Table,
    rows: Sequence[dict[str, Any]],
    *,
    replace_on: Sequence[str] = (),
) -> None:
    """Insert ``rows`` (dicts with the same keys) into ``table`` inside the caller's
    transaction; with ``replace_on`` (the columns of a unique key), a row whose key is there
    already replaces it (``ON CONFLICT … DO UPDATE``)."""
    if not rows:
        return
    columns = tuple(rows[0])
    if conn.dialect.name == "postgresql":
        try:
            payload = json.dumps(rows, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):  # a float that is not finite, a value JSON cannot say
            payload = None
        if payload is not None:
            quote = conn.dialect.identifier_preparer.quote
            statement = _from_json(quote, table, columns, tuple(replace_on))
            conn.execute(statement, {"p_rows": payload})
            return
    conn.execute(_row_by_row(conn.dialect.name, table, columns, tuple(replace_on)), list(rows))


@functools.lru_cache(maxsize=256)
def _from_json(
    quote: Callable[[str], str], table: Table, columns: tuple[str, ...], keys: tuple[str, ...]
) -> TextClause:
    """The one PostgreSQL statement for rows of ``columns`` (built once: see the module);
    ``quote``: the dialect's, which quotes a name only where it must be."""
    name = quote(table.name)
    listed = ", ".join(quote(c) for c in columns)
    sql = (
        f"INSERT INTO {name} ({listed}) SELECT {listed} "
        f"FROM json_populate_recordset(NULL::{name}, CAST(:p_rows AS json))"
    )
    if keys:
        changed = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in columns if c not in keys)
        sql += f" ON CONFLICT ({', '.join(quote(k) for k in keys)}) DO UPDATE SET {changed}"
    return text(sql)


@functools.cache
def _row_by_row(dialect: str, table: Table, columns: tuple[str, ...], keys: tuple[str, ...]) -> Any:
    """The ``executemany`` statement for rows of ``columns`` (built once per table and key)."""
    if not keys:
        return insert(table)
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as upsert
    else:
        from sqlalchemy.dialects.sqlite import insert as upsert  # type: ignore[assignment]
    statement = upsert(table)
    changed = {c: statement.excluded[c] for c in columns if c not in keys}
    return statement.on_conflict_do_update(index_elements=list(keys), set_=changed)
