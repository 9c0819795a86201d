"""Several rows of one table in one statement, whatever their number.

A run writes its rows a few at a time — a turn's messages, a step's trail records, a model
turn's events — and on PostgreSQL an ``executemany`` of them costs one protocol exchange per
row, each with its own parameters to convert, in the client and in the server alike. Here
the rows travel as one JSON array in one parameter of one statement whose text never changes
(so the server keeps it prepared), and the server takes them apart:

    INSERT INTO events (request_id, seq, payload)
    SELECT request_id, seq, payload FROM json_populate_recordset(NULL::events, $1)

The JSON way is taken only where it stores what a parameter would: every value is text (a
``str``, or a subclass such as a ``StrEnum``: JSON and psycopg both send its text), an integer,
``None`` or a finite float in a column of floats (a boolean, or a float given for an integer
column, is read otherwise by PostgreSQL's JSON conversion, or refused), the text is storable
already (``audit.redaction.storable``: no NUL, no lone surrogate, which fail either way), and
no column left out has a default of SQLAlchemy's to fill in (a ``text`` statement applies
none). Other rows go by ``executemany``, as every row does on SQLite, where a statement per
row costs no round trip.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Float, Table, TextClause, insert, text


def insert_rows(
    conn: Connection,
    table: Table,
    rows: Sequence[dict[str, Any]],
    *,
    replace_on: Sequence[str] = (),
) -> None:
    """Insert ``rows`` (dicts with the same keys) into ``table`` inside the caller's
    transaction; with ``replace_on`` (the columns of a unique key), a row whose key is there
    already replaces it (``ON CONFLICT … DO UPDATE``), and of rows with the same key the last
    one given is stored, as row by row."""
    if not rows:
        return
    columns, keys = tuple(rows[0]), tuple(replace_on)
    if conn.dialect.name == "postgresql":
        if keys:  # one statement may not change a row twice: the last of each key stays
            rows = list({tuple(row[k] for k in keys): row for row in rows}.values())
        payload = json_rows(table, rows)
        if payload is not None:
            quote = conn.dialect.identifier_preparer.quote
            conn.execute(_from_json(quote, table, columns, keys), {"p_rows": payload})
            return
    conn.execute(_row_by_row(conn.dialect.name, table, columns, keys), list(rows))


def json_rows(table: Table, rows: Sequence[dict[str, Any]]) -> str | None:
    """``rows`` (dicts with the same keys, at least one) as the JSON array PostgreSQL's
    ``json_populate_recordset(NULL::table, …)`` reads back as the same values, or ``None``
    where they cannot go that way (see the module): for statements that take rows so."""
    fractional = _fractional(table, tuple(rows[0]))
    return _as_json(rows, fractional) if fractional is not None else None


_WHOLE = frozenset({str, int, type(None)})
"""The types whose values PostgreSQL's JSON conversion reads as it reads a parameter, in any
column (``bool`` is not among them: ``type(True)`` is ``bool``, not ``int``); a ``float``
only in a column of floats."""


def _as_json(rows: Sequence[dict[str, Any]], fractional: frozenset[str]) -> str | None:
    """The rows as one JSON array, or ``None`` where a value is not plain (see the module)."""
    whole = _WHOLE
    for row in rows:
        for name, value in row.items():
            kind = type(value)
            if kind in whole or (kind is float and name in fractional):
                continue
            if not isinstance(value, str):  # a str enum (a stage, a role): its text, either way
                return None
    try:
        return json.dumps(rows, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a float that is not finite: JSON cannot say it
        return None


@functools.lru_cache(maxsize=256)
def _fractional(table: Table, columns: tuple[str, ...]) -> frozenset[str] | None:
    """Which of ``columns`` hold floats; ``None`` when the rows cannot go as JSON: a column
    that is not ``table``'s, or one left out that has a default SQLAlchemy would fill in
    (what the server fills in, a serial id, it fills in either way)."""
    if not set(columns) <= set(table.c.keys()):
        return None
    if any(column.default is not None for column in table.c if column.name not in columns):
        return None
    return frozenset(name for name in columns if isinstance(table.c[name].type, Float))


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
    statement = dialect_insert(dialect)(table)
    changed = {c: statement.excluded[c] for c in columns if c not in keys}
    return statement.on_conflict_do_update(index_elements=list(keys), set_=changed)


def dialect_insert(dialect: str) -> Any:
    """The ``insert`` of ``dialect``'s SQLAlchemy module (the one with ``ON CONFLICT``)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert
