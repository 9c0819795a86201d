"""What an attempt writes while it holds a run's lease: the fenced layer of
``worker.store.RunStore``. Each method checks the writer's fencing token in the transaction
that writes (``LeasedRuns._fence``; on PostgreSQL a batch and a completed run's ending are one
statement each, fenced by a part of their own: ``worker.run_writes``), so a copy of the
run that lost its lease writes nothing: the journal (``write_journal``, ``write_batch``), the
session's turn (``save_turn``), trail records and events, the deadline, and the run's ending
(``finish``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update

from hermes_agent.audit.records import AuditRecord
from hermes_agent.storage.schema import journal_table, runs_table
from hermes_agent.storage.sql import append_messages
from hermes_agent.types import Message
from hermes_agent.worker.leases import LeasedRuns
from hermes_agent.worker.run_rows import (
    DEADLINE_KEY,
    LIMITS_KEY,
    Batch,
    LeaseLost,
    RunStatus,
)
from hermes_agent.worker.run_writes import (
    append_event,
    batch_write,
    finish_write,
    insert_batch,
)


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
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            insert_batch(conn, request_id, token, Batch(entries={key: (state, payload)}))

    def write_batch(
        self, request_id: str, token: int, batch: Batch, *, renew: float | None = None
    ) -> None:
        """Write ``batch`` in one transaction fenced by ``token`` (a model turn of the run:
        its journal entries, events and trail records); on PostgreSQL one statement
        (``worker.run_writes``). ``renew``: a lease_ttl — the same transaction extends
        the lease from when the store runs it (the intents of tool calls about to start: the
        check that the lease is this attempt's and the intent land together, or neither)."""
        if not self.storage.driver.write(
            batch_write(self.storage, request_id, token, batch, renew)
        ):
            raise LeaseLost(f"run {request_id}: the lease passed to another worker")

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
        (``worker.run_writes``)."""
        write = finish_write(
            self.storage,
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
        held, following = self.storage.driver.write(write)
        if not held:
            raise LeaseLost(f"run {request_id}: the lease passed to another worker")
        return following

    def write_records(self, request_id: str, token: int, records: Sequence[AuditRecord]) -> None:
        """Add records of the run's trail, fenced by ``token`` (a copy of the run that lost
        its lease adds nothing more to the trail)."""
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            insert_batch(conn, request_id, token, Batch(records=list(records)))

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
            deadline = {"at_ns": at_ns, "run_timeout_s": float(timeout)}
            insert_batch(conn, request_id, token, Batch(entries={DEADLINE_KEY: ("done", deadline)}))
            return at_ns, float(timeout)
