"""The state of queued runs, in the agent's SQL store (PostgreSQL when workers run on several
machines): the runs, each run's journal, its events and its pending approvals.

Four tables beside the sessions and the audit trail (defined in ``storage.schema`` and made by
its migrations when the storage opens):

- ``hermes_runs`` — one row per queued run: what to run, its status, its lease (the worker
  holding it, a fencing token that grows with each claim, when the lease expires), how many
  times it was taken over, and its result;
- ``hermes_run_journal`` — the run's model turns and tool calls (``pipeline.journal``), each
  write fenced: it lands only while the writer's token is the run's current token;
- ``hermes_run_events`` — the run's events in order, for callers following it from any process;
- ``hermes_run_approvals`` — calls waiting for (or given) a decision.

Statuses: ``queued`` → ``running`` → ``completed`` | ``failed``; ``running`` →
``waiting_approval`` → ``queued`` (the answer re-enqueues it); a run lost with its worker more
than ``max_redeliveries`` times is ``dead`` (the dead letter); an operator's requeue puts a
dead or failed run back to ``queued``; ``cancelled`` by its caller.

The store is in layers, a module each: the row types (``worker.run_rows``), the writes its
transactions share (``worker.run_writes``), claims and leases (``worker.leases``), the lease
holder's fenced writes (``worker.fenced``), and here the rest — submitting, reading, cancelling,
requeueing, events and approvals. Every public name stays importable from here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, and_, delete, func, insert, select, update

from hermes_agent.runs.events import ApprovalResolvedEvent
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.storage.base import StorageError, check_session_id
from hermes_agent.storage.schema import approvals_table as approvals_table
from hermes_agent.storage.schema import events_table as events_table
from hermes_agent.storage.schema import journal_table as journal_table
from hermes_agent.storage.schema import metadata as metadata
from hermes_agent.storage.schema import runs_table as runs_table
from hermes_agent.worker.fenced import FencedWrites
from hermes_agent.worker.leases import LAPSE_KEY, STRIKES_KEY
from hermes_agent.worker.run_rows import DEADLINE_KEY as DEADLINE_KEY
from hermes_agent.worker.run_rows import FINISHED as FINISHED
from hermes_agent.worker.run_rows import LIMITS_KEY as LIMITS_KEY
from hermes_agent.worker.run_rows import Batch as Batch
from hermes_agent.worker.run_rows import Claim as Claim
from hermes_agent.worker.run_rows import LeaseLost as LeaseLost
from hermes_agent.worker.run_rows import QueuedRun as QueuedRun
from hermes_agent.worker.run_rows import RunStatus as RunStatus
from hermes_agent.worker.run_rows import dumps as dumps
from hermes_agent.worker.run_rows import now_ns, queued_run
from hermes_agent.worker.run_writes import append_event, insert_batch, write_ending


class RunStore(FencedWrites):
    """The queued runs of one SQL store (see the module docstring): submitting and reading them
    here, cancelling and requeueing, their events and approvals; claims and leases in
    ``worker.leases.LeasedRuns``, the holder's fenced writes in ``worker.fenced.FencedWrites``.
    """

    # -- submitting -------------------------------------------------------------------

    def add(
        self,
        session_id: str,
        request: QueuedRequest,
        *,
        owner: str = "",
        request_id: str | None = None,
        run_timeout_s: float | None = None,
        admit: Callable[[Connection], None] | None = None,
    ) -> str:
        """Record a run to be queued; returns its request id. ``run_timeout_s``: the run
        ends ``timed_out`` once that long has passed since a worker first started it.
        ``admit`` runs first in the same transaction and may raise to refuse the run (nothing
        is written): a check of what the store holds that the insert cannot race."""
        check_session_id(session_id, self.storage.max_id_length)  # refused before it queues
        request_id = request_id or str(uuid.uuid4())
        now = now_ns()
        with self._tx() as conn:
            if admit is not None:
                admit(conn)
            conn.execute(
                insert(runs_table).values(
                    request_id=request_id,
                    session_id=session_id,
                    owner=owner,
                    request=dumps(request.model_dump(mode="json", exclude_defaults=True)),
                    status="queued",
                    created_ns=now,
                    updated_ns=now,
                    parked=False,
                    claims=0,
                    redeliveries=0,
                    lease_token=0,
                    turn_saved=False,
                )
            )
            if run_timeout_s is not None:
                limits = {"run_timeout_s": float(run_timeout_s)}
                insert_batch(conn, request_id, 0, Batch(entries={LIMITS_KEY: ("done", limits)}))
        return request_id

    def get(self, request_id: str) -> QueuedRun | None:
        with self._tx(write=False) as conn:
            row = conn.execute(
                select(runs_table).where(runs_table.c.request_id == request_id)
            ).first()
        return queued_run(row) if row is not None else None

    def finished_since(self, owner: str, since_ns: int, limit: int) -> list[str]:
        """The ids of ``owner``'s runs created since ``since_ns`` that have ended."""
        r = runs_table.c
        query = (
            select(r.request_id)
            .where(r.owner == owner, r.created_ns >= since_ns, r.status.in_(FINISHED))
            .limit(limit)
        )
        with self._tx(write=False) as conn:
            return [row[0] for row in conn.execute(query)]

    def runs(
        self, *, status: str | None = None, owner: str | None = None, limit: int = 50
    ) -> list[QueuedRun]:
        query = select(runs_table).order_by(runs_table.c.created_ns.desc()).limit(limit)
        if status is not None:
            query = query.where(runs_table.c.status == status)
        if owner is not None:
            query = query.where(runs_table.c.owner == owner)
        with self._tx(write=False) as conn:
            return [queued_run(row) for row in conn.execute(query)]

    def cancel(self, request_id: str, reason: str = "cancelled by the client") -> bool:
        """Cancel a run that has not finished; its ending (the trail's ``stopped`` record and
        the ``run_stopped`` event) is written here, in the same transaction. A worker running
        it notices at its next heartbeat (or its next write, fenced out from now on)."""
        r = runs_table.c
        with self._tx() as conn:
            conn.execute(select(r.status).where(r.request_id == request_id).with_for_update())
            done = conn.execute(
                update(runs_table)
                .where(r.request_id == request_id, r.status.not_in(FINISHED))
                .values(
                    status="cancelled",
                    error=reason,
                    updated_ns=now_ns(),
                    lease_owner=None,
                    lease_expires_ns=None,
                )
            )
            if done.rowcount == 1:
                # The ending, written here whoever holds the run: its worker's writes are
                # fenced out from now on, so nothing comes after it.
                session = conn.execute(
                    select(r.session_id).where(r.request_id == request_id)
                ).scalar_one()
                write_ending(conn, request_id, session, "cancelled", reason)
        return done.rowcount == 1

    def requeue(self, request_id: str) -> QueuedRun:
        """An operator puts a dead, failed or cancelled run back (its journal is kept, so it
        resumes where it stopped; its redeliveries start again from zero)."""
        r = runs_table.c
        with self._tx() as conn:
            row = conn.execute(
                select(runs_table).where(r.request_id == request_id).with_for_update()
            ).first()
            if row is None:
                raise StorageError(f"no queued run {request_id!r}; see `hermes-agent runs list`")
            if row.status not in ("dead", "failed", "cancelled", "timed_out"):
                raise StorageError(
                    f"run {request_id} is {row.status}; only a dead, failed, cancelled or "
                    "timed-out run can be requeued"
                )
            newer = conn.execute(
                select(func.count())
                .select_from(runs_table)
                .where(
                    r.session_id == row.session_id,
                    r.request_id != request_id,
                    (r.created_ns > row.created_ns)
                    | and_(r.created_ns == row.created_ns, r.request_id > request_id),
                    (r.claims > 0) | (r.status != "queued"),
                )
            ).scalar_one()
            if newer:
                raise StorageError(
                    f"run {request_id} cannot be requeued: a later turn of session "
                    f"{row.session_id!r} has started since, and this turn would come after it "
                    "with an answer to an older history; submit the message again instead"
                )
            # Its deadline starts again with its next attempt, and its charges from zero.
            conn.execute(
                delete(journal_table).where(
                    journal_table.c.request_id == request_id,
                    journal_table.c.key.in_([DEADLINE_KEY, LAPSE_KEY, STRIKES_KEY]),
                )
            )
            conn.execute(
                update(runs_table)
                .where(r.request_id == request_id)
                .values(
                    status="queued",
                    delivered_ns=None,
                    redeliveries=0,
                    error=None,
                    result=None,
                    updated_ns=now_ns(),
                    parked=False,
                )
            )
        found = self.get(request_id)
        assert found is not None
        return found

    # -- events -----------------------------------------------------------------------

    def add_event(self, request_id: str, wire: dict[str, Any]) -> int:
        with self._tx() as conn:
            return append_event(conn, request_id, wire)

    def events(self, request_id: str, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        e = events_table.c
        with self._tx(write=False) as conn:
            rows = conn.execute(
                select(e.seq, e.payload)
                .where(e.request_id == request_id, e.seq > after)
                .order_by(e.seq)
            ).all()
        return [(row.seq, json.loads(row.payload)) for row in rows]

    # -- approvals --------------------------------------------------------------------

    def approval(self, request_id: str, key: str) -> tuple[str, str | None] | None:
        a = approvals_table.c
        with self._tx(write=False) as conn:
            row = conn.execute(
                select(a.status, a.reason).where(a.request_id == request_id, a.key == key)
            ).first()
        return (row.status, row.reason) if row is not None else None

    def park_for_approval(
        self,
        request_id: str,
        token: int,
        key: str,
        tool: str,
        arguments: dict[str, Any],
        event: dict[str, Any] | None = None,
        batch: Batch | None = None,
    ) -> None:
        """Record a call waiting for a decision, set the run aside (``waiting_approval``) and
        log ``event`` (the ``approval_required`` its followers see), in one fenced
        transaction: a decision can only come once all three are true."""
        a = approvals_table.c
        r = runs_table.c
        now = now_ns()
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            if batch:  # the turn that asked, and what the attempt did before it
                insert_batch(conn, request_id, token, batch)
            if (
                conn.execute(
                    select(a.status).where(a.request_id == request_id, a.key == key)
                ).first()
                is None
            ):
                conn.execute(
                    insert(approvals_table).values(
                        request_id=request_id,
                        key=key,
                        tool=tool,
                        arguments=dumps(arguments),
                        status="pending",
                        reason=None,
                        updated_ns=now,
                    )
                )
            conn.execute(
                update(runs_table)
                .where(r.request_id == request_id)
                .values(
                    status="waiting_approval",
                    updated_ns=now,
                    lease_owner=None,
                    lease_expires_ns=None,
                )
            )
            if event is not None:
                append_event(conn, request_id, event)

    def pending_approvals(self, request_id: str | None = None) -> list[dict[str, Any]]:
        a = approvals_table.c
        query = select(approvals_table).where(a.status == "pending")
        if request_id is not None:
            query = query.where(a.request_id == request_id)
        with self._tx(write=False) as conn:
            return [
                {
                    "request_id": row.request_id,
                    "approval_id": row.key,
                    "tool": row.tool,
                    "arguments": json.loads(row.arguments),
                    "asked_ns": row.updated_ns,
                }
                for row in conn.execute(query)
            ]

    def decide(
        self,
        request_id: str,
        key: str,
        approved: bool,
        reason: str | None,
        admit: Callable[[Connection], None] | None = None,
    ) -> bool:
        """Answer a pending approval and put its run back in the queue (``True`` when there
        was such a pending approval). The caller enqueues the run. ``admit`` as in ``add``:
        the run comes back in flight."""
        a = approvals_table.c
        r = runs_table.c
        with self._tx() as conn:
            if admit is not None:
                admit(conn)
            done = conn.execute(
                update(approvals_table)
                .where(a.request_id == request_id, a.key == key, a.status == "pending")
                .values(
                    status="approved" if approved else "denied", reason=reason, updated_ns=now_ns()
                )
            )
            if done.rowcount != 1:
                return False
            conn.execute(
                update(runs_table)
                .where(r.request_id == request_id, r.status == "waiting_approval")
                .values(status="queued", updated_ns=now_ns(), delivered_ns=None)
            )
            verdict = reason or ("approved" if approved else "denied")
            append_event(conn, request_id, ApprovalResolvedEvent(key, approved, verdict).to_dict())
        return True
