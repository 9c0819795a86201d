"""A queued run's writes, each made of ``storage.statements``' one form per database: a batch
of journal entries, events and trail records (``insert_batch`` inside a transaction,
``batch_write`` fenced on its own), the next event of the run's log (``append_event``), and the
run's ending (``finish_write``; ``write_ending``, the trail's and the log's ending of a run that
ended without an answer, inside the transaction that ends it). ``batch_write`` and
``finish_write`` give a ``Write`` that ``storage.driver`` sends: on PostgreSQL one statement
fenced by its ``held`` part, on SQLite the transaction's statements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, update

from hermes_agent.audit.recorder import lifecycle_record
from hermes_agent.audit.records import RECORD_FIELDS, AuditRecord, Role
from hermes_agent.runs.events import RunStoppedEvent
from hermes_agent.runs.status import STOP_CODES
from hermes_agent.storage.schema import audit_table, events_table, journal_table, runs_table
from hermes_agent.storage.sql import SqlStorage, append_messages, message_rows
from hermes_agent.storage.statements import (
    END_RUN,
    LAST_OF_TRAIL,
    LAST_RECORD,
    LOCK_RUN,
    NEXT_EVENT,
    RUN_ROW,
    STOPPED_FROM_LATEST,
    Quote,
    Write,
    batch_parameters,
    batch_statement,
    finish_statement,
    insert_rows,
    rows_json,
    turn_parameters,
)
from hermes_agent.types import Message
from hermes_agent.worker.run_rows import Batch, dumps, now_ns


def batch_rows(
    request_id: str, token: int, batch: Batch, now: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """A batch's rows: its journal entries, its events and its trail records."""
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
    """A batch's writes, inside the caller's fenced transaction: one statement per table."""
    entries, events, records = batch_rows(request_id, token, batch, now_ns())
    insert_rows(conn, journal_table, entries)
    insert_rows(conn, events_table, events)
    insert_rows(conn, audit_table, records)


def fenced(conn: Connection, request_id: str, token: int) -> Any | None:
    """The run's row, held for the transaction, if ``token`` holds its lease (else ``None``)."""
    row = conn.execute(RUN_ROW, {"p_request_id": request_id}).first()
    if row is None or row.lease_token != token or row.status != "running":
        return None
    return row


def _tables(request_id: str, token: int, batch: Batch, now: int) -> list[tuple[Any, Any]]:
    entries, events, records = batch_rows(request_id, token, batch, now)
    return [(journal_table, entries), (events_table, events), (audit_table, records)]


def batch_write(
    storage: SqlStorage, request_id: str, token: int, batch: Batch, renew: float | None
) -> Write[bool]:
    """``batch`` written fenced by ``token`` (``True``: written; ``False``: the lease is not
    this token's, nothing written). ``renew``: a lease_ttl by which the same write extends
    the lease, from when the store runs it."""
    dialect = storage.engine.dialect
    if dialect.name == "postgresql":
        names, bound = batch_parameters(_tables(request_id, token, batch, now_ns()))
        bound.update(p_request_id=request_id, p_token=token)
        if renew is not None:
            bound["p_ttl_ns"] = int(renew * 1e9)
        statement = batch_statement(dialect.identifier_preparer.quote, names, renew is not None)
        return Write(statement=statement, params=bound, read=_held)

    def steps(conn: Connection) -> bool:
        if fenced(conn, request_id, token) is None:
            return False
        insert_batch(conn, request_id, token, batch)
        if renew is not None:
            now = now_ns()  # SQLite: the worker's clock, read once the write lock is held
            conn.execute(
                update(runs_table)
                .where(runs_table.c.request_id == request_id)
                .values(lease_expires_ns=now + int(renew * 1e9), heartbeat_ns=now)
            )
        return True

    return Write(core=steps)


def _held(row: Any) -> bool:
    return bool(row.held)


def finish_write(
    storage: SqlStorage,
    request_id: str,
    token: int,
    status: str,
    *,
    result: dict[str, Any] | None,
    error: str | None,
    turn: Sequence[Message] | None,
    output: AuditRecord | None,
    event: dict[str, Any] | None,
    batch: Batch | None,
) -> Write[tuple[bool, str | None]]:
    """The run's ending fenced by ``token`` (``FencedWrites.finish``): ``(held, following)``
    — whether the lease was this token's (nothing is written otherwise) and the session's
    next run if it is parked waiting for this one."""
    batch = batch if batch is not None else Batch()
    dialect = storage.engine.dialect
    if dialect.name == "postgresql":
        return _finish_statement(
            dialect.identifier_preparer.quote,
            request_id,
            token,
            status,
            result=result,
            error=error,
            turn=turn,
            output=output,
            event=event,
            batch=batch,
        )
    if event is not None and batch.events:
        # Numbered after the holder's own, and written with them.
        batch = _with_event(batch, event)
        event, ends_with_event = None, True
    else:
        ends_with_event = event is not None

    def steps(conn: Connection) -> tuple[bool, str | None]:
        row = fenced(conn, request_id, token)
        if row is None:
            return False, None
        if batch:
            insert_batch(conn, request_id, token, batch)
        if turn and not row.turn_saved:
            append_messages(conn, row.session_id, turn)
        if status == "completed" and output is not None:
            add_last_record(conn, output)
        elif status != "completed":
            write_ending(
                conn,
                request_id,
                row.session_id,
                status,
                error,
                add_event=not ends_with_event,
                locked=True,
            )
        if event is not None:
            append_event(conn, request_id, event, locked=True)
        # Last, just before the commit: its read of the session's next run is as late as
        # a read of its own was (a run parked after it waits for the sweeper).
        following: str | None = conn.execute(
            END_RUN,
            {
                "p_request_id": request_id,
                "p_status": status,
                "p_now": now_ns(),
                "p_result": dumps(result) if result is not None else None,
                "p_error": error,
                "p_turn_saved": bool(turn) or row.turn_saved,
            },
        ).scalar_one()
        return True, following

    return Write(core=steps)


def _with_event(batch: Batch, event: dict[str, Any]) -> Batch:
    """``batch`` with ``event`` numbered after its own last."""
    return Batch(batch.entries, [*batch.events, (batch.events[-1][0] + 1, event)], batch.records)


def _finish_statement(
    quote: Quote,
    request_id: str,
    token: int,
    status: str,
    *,
    result: dict[str, Any] | None,
    error: str | None,
    turn: Sequence[Message] | None,
    output: AuditRecord | None,
    event: dict[str, Any] | None,
    batch: Batch,
) -> Write[tuple[bool, str | None]]:
    """PostgreSQL: every ending of the lease holder as one statement
    (``statements.finish_statement``): the answer's record for a completed run, a ``stopped``
    record and a ``run_stopped`` event (unless ``event`` is its last) otherwise."""
    now = now_ns()
    stopped = status != "completed"
    if stopped and event is None:
        event = RunStoppedEvent(status, error).to_dict()
    if event is not None and batch.events:  # numbered after the holder's own, with them
        batch, event = _with_event(batch, event), None
    names, bound = batch_parameters(_tables(request_id, token, batch, now))
    bound.update(
        p_request_id=request_id,
        p_token=token,
        p_now=now,
        p_status=status,
        p_result=dumps(result) if result is not None else None,
        p_error=error,
        p_has_turn=bool(turn),
    )
    # The trail's ending is numbered after every record the trail holds, the batch's
    # included: the statement's parts do not see one another's rows, so the batch's numbers
    # are counted in here.
    after = max(batch.records, key=lambda r: r.seq) if batch.records else None
    last: dict[str, Any] = {}
    if stopped:
        record = lifecycle_record(
            [],
            request_id=request_id,
            session_id="",
            stage="Worker",
            role=Role.STOPPED,
            content={"status": status, "error": error},
            status_code=STOP_CODES.get(status, 500),
            model_name="",
        )
        last = {k: v for k, v in record.to_dict().items() if k not in STOPPED_FROM_LATEST}
        last.pop("seq")
        bound.update(
            p_wanted=after.seq + 1 if after is not None else 0,
            p_step=after.step if after is not None else None,
            p_model=after.model_name if after is not None else None,
            p_sha=after.system_prompt_sha256 if after is not None else None,
        )
    elif output is not None:
        last = output.to_dict()
        bound["p_wanted"] = max([int(last.pop("seq")), *(r.seq + 1 for r in batch.records)])
    if last:
        bound["p_last"] = rows_json(audit_table, [last])
    if turn:
        bound.update(turn_parameters(message_rows("", 0, turn), now))
    if event is not None:
        bound["p_event"] = dumps(event)
    statement = finish_statement(quote, names, tuple(last), bool(turn), event is not None, stopped)
    return Write(statement=statement, params=bound, read=_ended)


def _ended(row: Any) -> tuple[bool, str | None]:
    return bool(row.held), row.following


def add_last_record(conn: Connection, record: AuditRecord) -> None:
    """Add the trail's ending, numbered after every record the trail holds (SQLite's form;
    PostgreSQL's is a part of its ending's one statement)."""
    conn.execute(LAST_RECORD, {f"p_{name}": value for name, value in record.to_dict().items()})


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
    last = conn.execute(LAST_OF_TRAIL, {"p_request_id": request_id}).first()
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
    insert_rows(conn, audit_table, [record.to_dict()])  # the trail's one form of its rows
    if add_event:
        append_event(conn, request_id, RunStoppedEvent(status, error).to_dict(), locked=locked)


def append_event(
    conn: Connection, request_id: str, wire: dict[str, Any], *, locked: bool = False
) -> int:
    """Append one event to a run's log, inside the caller's transaction (``locked``: which
    holds the run's row already; otherwise it is held first, so that the run's event writers
    — an attempt and a service writing at once — take turns)."""
    if not locked:
        conn.execute(LOCK_RUN, {"p_request_id": request_id})
    bound = {"p_request_id": request_id, "p_event": dumps(wire)}
    return int(conn.execute(NEXT_EVENT, bound).scalar_one())
