"""What an attempt writes while it holds a run's lease: the fenced layer of
``worker.store.RunStore``. Each method checks the writer's fencing token in the transaction
that writes (``LeasedRuns._fence``; on PostgreSQL a batch and a completed run's ending are one
statement each, fenced by a part of their own: ``worker.fenced_statements``), so a copy of the
run that lost its lease writes nothing: the journal (``write_journal``, ``write_batch``), the
session's turn (``save_turn``), trail records and events, the deadline, and the run's ending
(``finish``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BindParameter,
    Select,
    bindparam,
    case,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.sql.dml import ReturningUpdate

from hermes_agent.audit.records import AuditRecord
from hermes_agent.storage.schema import audit_table, journal_table, runs_table
from hermes_agent.storage.sql import append_messages
from hermes_agent.types import Message
from hermes_agent.worker.fenced_statements import finish_at_once, write_batch_at_once
from hermes_agent.worker.leases import FINISHED_SQL, LeasedRuns, renewed
from hermes_agent.worker.run_rows import (
    DEADLINE_KEY,
    LIMITS_KEY,
    Batch,
    LeaseLost,
    RunStatus,
    dumps,
    now_ns,
)
from hermes_agent.worker.run_writes import (
    add_last_record,
    append_event,
    insert_batch,
    write_ending,
)


def _ending_row_statement() -> Select[Any]:
    r = runs_table.c
    return (
        select(r.lease_token, r.status, r.session_id, r.turn_saved)
        .where(r.request_id == bindparam("p_request_id"))
        .with_for_update()
    )


def _end_run_statement() -> ReturningUpdate[Any]:
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
            o.status.not_in(FINISHED_SQL),
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


# Built once (see leases.py: building a statement costs more than running it).
_ENDING_ROW = _ending_row_statement()
_END_RUN = _end_run_statement()


class FencedWrites(LeasedRuns):
    """The writes of the attempt holding a run (see the module docstring)."""

    # -- the journal ------------------------------------------------------------------

    def journal_entry(self, request_id: str, key: str) -> tuple[str, Any] | None:
        j = journal_table.c
        with self._tx(write=False) as conn:
            row = conn.execute(
                select(j.state, j.payload).where(j.request_id == request_id, j.key == key)
            ).first()
        return (row.state, json.loads(row.payload)) if row is not None else None

    def journal_entries(self, request_id: str) -> dict[str, tuple[str, Any]]:
        j = journal_table.c
        with self._tx(write=False) as conn:
            rows = conn.execute(
                select(j.key, j.state, j.payload).where(j.request_id == request_id)
            ).all()
        return {row.key: (row.state, json.loads(row.payload)) for row in rows}

    def write_journal(
        self, request_id: str, token: int, key: str, state: str, payload: Any
    ) -> None:
        """Insert or replace one journal entry, fenced by ``token``."""
        j = journal_table.c
        now = now_ns()
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            found = conn.execute(
                select(j.state).where(j.request_id == request_id, j.key == key)
            ).first()
            values = {"state": state, "payload": dumps(payload), "token": token, "updated_ns": now}
            if found is None:
                conn.execute(insert(journal_table).values(request_id=request_id, key=key, **values))
            else:
                conn.execute(
                    update(journal_table)
                    .where(j.request_id == request_id, j.key == key)
                    .values(**values)
                )

    def write_batch(
        self, request_id: str, token: int, batch: Batch, *, renew: float | None = None
    ) -> None:
        """Write ``batch`` in one transaction fenced by ``token`` (a model turn of the run:
        its journal entries, events and trail records); on PostgreSQL one statement
        (``worker.fenced_statements``). ``renew``: a lease_ttl — the same transaction extends
        the lease from when the store runs it (the intents of tool calls about to start: the
        check that the lease is this attempt's and the intent land together, or neither)."""
        if self._single_statements:
            if not write_batch_at_once(self.storage, request_id, token, batch, renew=renew):
                raise LeaseLost(f"run {request_id}: the lease passed to another worker")
            return
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            insert_batch(conn, request_id, token, batch)
            if renew is not None:
                conn.execute(
                    update(runs_table)
                    .where(runs_table.c.request_id == request_id)
                    .values(**renewed(renew, conn))
                )

    def save_turn(
        self, request_id: str, token: int, session_id: str, messages: Sequence[Message]
    ) -> None:
        """Append the run's turn to its session, once, in the fenced transaction."""
        r = runs_table.c
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            saved = conn.execute(
                select(r.turn_saved).where(r.request_id == request_id)
            ).scalar_one()
            if saved:
                return  # an earlier attempt saved it and died before finishing
            if messages:
                append_messages(conn, session_id, messages)
            conn.execute(
                update(runs_table).where(r.request_id == request_id).values(turn_saved=True)
            )

    # -- endings ----------------------------------------------------------------------

    def finish(
        self,
        request_id: str,
        token: int,
        status: RunStatus,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        turn: Sequence[Message] | None = None,
        output: AuditRecord | None = None,
        event: dict[str, Any] | None = None,
        batch: Batch | None = None,
    ) -> str | None:
        """End the run (``completed``, ``failed``, ``timed_out``), in one fenced transaction
        with everything its ending consists of: ``turn`` added to its session (once), the
        trail's one ending — ``output`` (the answer's record) for a completed run, a
        ``stopped`` record otherwise — numbered after every other record of the run, and
        ``event``, its last event. So a run is final exactly when its trail has its ending
        and its followers their last event, and a store that fails in between leaves none
        of them (the attempt ends, and the run resumes). Returns the session's next run if it
        is parked waiting for this one (read in the same transaction: the hand-over costs no
        read of its own). On PostgreSQL a completed run's ending is one statement
        (``worker.fenced_statements``)."""
        if self._single_statements and status == "completed" and output is not None:
            ended = finish_at_once(
                self.storage,
                request_id,
                token,
                result=result,
                error=error,
                turn=turn,
                output=output,
                event=event,
                batch=batch,
            )
            if not ended[0]:
                raise LeaseLost(f"run {request_id}: the lease passed to another worker")
            return ended[1]
        with self._tx() as conn:
            row = conn.execute(_ENDING_ROW, {"p_request_id": request_id}).first()
            if row is None or row.lease_token != token or row.status != "running":
                raise LeaseLost(f"run {request_id}: the lease passed to another worker")
            ends_with_event = event is not None
            if event is not None and batch is not None and batch.events:
                # Numbered after the holder's own, and written with them: one statement.
                ending = (batch.events[-1][0] + 1, event)
                batch, event = dataclasses.replace(batch, events=[*batch.events, ending]), None
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
                _END_RUN,
                {
                    "p_request_id": request_id,
                    "p_status": status,
                    "p_now": now_ns(),
                    "p_result": dumps(result) if result is not None else None,
                    "p_error": error,
                    "p_turn_saved": bool(turn) or row.turn_saved,
                },
            ).scalar_one()
            return following

    def write_records(self, request_id: str, token: int, records: Sequence[AuditRecord]) -> None:
        """Add records of the run's trail, fenced by ``token`` (a copy of the run that lost
        its lease adds nothing more to the trail)."""
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            if records:
                conn.execute(insert(audit_table), [r.to_dict() for r in records])

    def add_fenced_event(self, request_id: str, token: int, wire: dict[str, Any]) -> int:
        """Append an event of the run's pipeline, fenced by ``token``."""
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            return append_event(conn, request_id, wire)

    def start_deadline(self, request_id: str, token: int, now_ns: int) -> tuple[int, float] | None:
        """The run's deadline (ns since the epoch) and its ``run_timeout_s``: set by its first
        attempt from the ``run_timeout_s`` it was submitted with, the same for every later
        attempt; ``None`` without one."""
        j = journal_table.c
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            rows = dict(
                conn.execute(
                    select(j.key, j.payload).where(
                        j.request_id == request_id, j.key.in_([LIMITS_KEY, DEADLINE_KEY])
                    )
                ).all()
            )
            if DEADLINE_KEY in rows:
                found = json.loads(rows[DEADLINE_KEY])
                return int(found["at_ns"]), float(found["run_timeout_s"])
            if LIMITS_KEY not in rows:
                return None
            timeout = json.loads(rows[LIMITS_KEY]).get("run_timeout_s")
            if timeout is None:
                return None
            at_ns = now_ns + int(float(timeout) * 1e9)
            conn.execute(
                insert(journal_table).values(
                    request_id=request_id,
                    key=DEADLINE_KEY,
                    state="done",
                    payload=dumps({"at_ns": at_ns, "run_timeout_s": float(timeout)}),
                    token=token,
                    updated_ns=now_ns,
                )
            )
            return at_ns, float(timeout)
