"""The writes a queued run's transactions share, each inside the caller's transaction: a
batch of journal entries, events and trail records (``insert_batch``), the next event of the
run's log (``append_event``), and the trail's ending (``add_last_record`` for an answer,
``write_ending`` for a run that ended without one)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Insert, Integer, bindparam, case, func, insert, select

from hermes_agent.audit.recorder import lifecycle_record
from hermes_agent.audit.records import RECORD_FIELDS, AuditRecord, Role
from hermes_agent.runs.events import RunStoppedEvent
from hermes_agent.runs.status import STOP_CODES
from hermes_agent.storage.bulk import insert_rows
from hermes_agent.storage.schema import audit_table, events_table, journal_table, runs_table
from hermes_agent.worker.run_rows import Batch, dumps, now_ns


def _last_record_statement() -> Insert:
    """The trail's ending, numbered after every record the trail holds, in one statement: the
    latest number is read by a subquery of the insert."""
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


_LAST_RECORD = _last_record_statement()


def batch_rows(
    request_id: str, token: int, batch: Batch, now: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """A batch's rows: its journal entries, its events and its trail records (shared by the
    transaction's way here and the single statement's, ``worker.fenced_statements``)."""
    entries = [
        {
            "request_id": request_id,
            "key": key,
            "state": state,
            "payload": dumps(payload),
            "token": token,
            "updated_ns": now,
        }
        for key, (state, payload) in batch.entries.items()
    ]
    events = [
        {"request_id": request_id, "seq": seq, "payload": dumps(wire)} for seq, wire in batch.events
    ]
    return entries, events, [r.to_dict() for r in batch.records]


def insert_batch(conn: Connection, request_id: str, token: int, batch: Batch) -> None:
    """A batch's writes, inside the caller's fenced transaction: one statement per table
    (``storage.bulk``: on PostgreSQL one statement for all the rows of a table)."""
    entries, events, records = batch_rows(request_id, token, batch, now_ns())
    if entries:
        insert_rows(conn, journal_table, entries, replace_on=("request_id", "key"))
    if events:
        insert_rows(conn, events_table, events)
    if records:
        insert_rows(conn, audit_table, records)


def add_last_record(conn: Connection, record: AuditRecord) -> None:
    """Add the trail's ending, numbered after every record the trail holds."""
    conn.execute(_LAST_RECORD, {f"p_{name}": value for name, value in record.to_dict().items()})


def write_ending(
    conn: Connection,
    request_id: str,
    session_id: str,
    status: str,
    error: str | None,
    *,
    add_event: bool = True,
    locked: bool = False,
) -> None:
    """The ending of a run that ended without an answer, inside the transaction that ends it:
    a ``stopped`` record last in its trail and a ``run_stopped`` event last in its log
    (``locked``: the transaction holds the run's row already)."""
    a = audit_table.c
    last = conn.execute(
        select(audit_table).where(a.request_id == request_id).order_by(a.seq.desc()).limit(1)
    ).first()
    earlier = []
    if last is not None:
        earlier.append(AuditRecord(**{name: last._mapping[name] for name in RECORD_FIELDS}))
    record = lifecycle_record(
        earlier,
        request_id=request_id,
        session_id=session_id,
        stage="Worker",
        role=Role.STOPPED,
        content={"status": status, "error": error},
        status_code=STOP_CODES.get(status, 500),
        model_name="",
    )
    conn.execute(insert(audit_table).values(**record.to_dict()))
    if add_event:
        append_event(conn, request_id, RunStoppedEvent(status, error).to_dict(), locked=locked)


def append_event(
    conn: Connection, request_id: str, wire: dict[str, Any], *, locked: bool = False
) -> int:
    """Append one event to a run's log, inside the caller's transaction (``locked``: which
    holds the run's row already)."""
    e = events_table.c
    r = runs_table.c
    if not locked:
        # The run's row orders its event writers (an attempt and a service writing at once).
        conn.execute(select(r.request_id).where(r.request_id == request_id).with_for_update())
    seq = (
        conn.execute(
            select(func.coalesce(func.max(e.seq), 0)).where(e.request_id == request_id)
        ).scalar_one()
        + 1
    )
    conn.execute(insert(events_table).values(request_id=request_id, seq=seq, payload=dumps(wire)))
    return int(seq)
