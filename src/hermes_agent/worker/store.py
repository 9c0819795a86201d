"""The state of queued runs, in the agent's SQL store (PostgreSQL when workers run on several
machines): the runs, each run's journal, its events and its pending approvals.

Four tables beside the sessions and the audit trail:

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
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    delete,
    func,
    insert,
    select,
    text,
    update,
)

from hermes_agent.audit.recorder import lifecycle_record
from hermes_agent.audit.records import AuditRecord, Role
from hermes_agent.runs.backend import RunView
from hermes_agent.runs.events import ApprovalResolvedEvent, RunStoppedEvent
from hermes_agent.runs.request import ClientTools, QueuedRequest
from hermes_agent.runs.status import STOP_CODES
from hermes_agent.storage.base import MAX_ID_LENGTH, StorageError, check_session_id
from hermes_agent.storage.sql import SqlStorage, append_messages, audit_table
from hermes_agent.types import Message

metadata = MetaData()

runs_table = Table(
    "hermes_runs",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("session_id", String(MAX_ID_LENGTH), nullable=False),
    Column("owner", String(255), nullable=False, default=""),
    Column("request", Text, nullable=False),
    Column("status", String(24), nullable=False),
    Column("created_ns", BigInteger, nullable=False),
    Column("updated_ns", BigInteger, nullable=False),
    Column("parked", Boolean, nullable=False, default=False),
    Column("claims", Integer, nullable=False, default=0),
    Column("redeliveries", Integer, nullable=False, default=0),
    Column("lease_token", Integer, nullable=False, default=0),
    Column("lease_owner", String(255), nullable=True),
    Column("lease_expires_ns", BigInteger, nullable=True),
    Column("heartbeat_ns", BigInteger, nullable=True),
    Column("requeued_ns", BigInteger, nullable=True),
    Column("delivered_ns", BigInteger, nullable=True),
    Column("turn_saved", Boolean, nullable=False, default=False),
    Column("result", Text, nullable=True),
    Column("error", Text, nullable=True),
    Index("ix_hermes_runs_session", "session_id", "created_ns"),
    Index("ix_hermes_runs_status", "status"),
)

journal_table = Table(
    "hermes_run_journal",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("key", String(64), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("payload", Text, nullable=False),
    Column("token", Integer, nullable=False),
    Column("updated_ns", BigInteger, nullable=False),
)

events_table = Table(
    "hermes_run_events",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("payload", Text, nullable=False),
)

approvals_table = Table(
    "hermes_run_approvals",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("key", String(128), primary_key=True),
    Column("tool", String(255), nullable=False),
    Column("arguments", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("updated_ns", BigInteger, nullable=False),
)

_TABLES_LOCK = 0x48_52_55_4E  # "HRUN": serialises creating these tables across processes

FINISHED = ("completed", "failed", "dead", "cancelled", "timed_out")

LIMITS_KEY = "limits"
"""The journal entry holding the run's limits as submitted (``run_timeout_s``)."""
DEADLINE_KEY = "deadline"
"""The journal entry holding the run's deadline (ns since the epoch), set by its first claim."""
# The one status vocabulary of a run, in process and on the queue.
from hermes_agent.runs.status import RunStatus as RunStatus  # noqa: E402


class LeaseLost(StorageError):
    """This worker's hold on a run has passed to another (its lease expired and another worker
    took the run over): it must stop at once and write nothing more."""


@dataclass(slots=True)
class QueuedRun:
    """One row of ``hermes_runs``."""

    request_id: str
    session_id: str
    owner: str
    request: dict[str, Any]
    status: str
    created_ns: int
    updated_ns: int
    claims: int
    redeliveries: int
    lease_token: int
    lease_owner: str | None
    lease_expires_ns: int | None
    heartbeat_ns: int | None
    result: dict[str, Any] | None
    error: str | None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def view(self, session_id: str | None = None) -> RunView:
        """The run in the one shape every door shows (``runs.backend.RunView``), as the store
        knows it: ``session_id`` as its owner named it (the stored one by default); the
        approvals waiting are the service's to add."""
        return RunView(
            request_id=self.request_id,
            session_id=session_id if session_id is not None else self.session_id,
            status=self.status,
            source="queue",
            created=self.created_ns / 1e9,
            finished=self.updated_ns / 1e9 if self.finished else None,
            result=self.result,
            error=self.error,
            attempts=self.claims,
            redeliveries=self.redeliveries,
            worker=self.lease_owner,
        )


@dataclass(slots=True)
class Claim:
    """What a worker got when it asked for a run."""

    outcome: Literal["claimed", "finished", "parked", "busy", "dead", "waiting"]
    token: int = 0
    resumed: bool = False
    """A takeover or a resume: an earlier attempt of this run did some of its work."""
    heartbeat_ns: int | None = None
    """``busy``: the holder's latest heartbeat."""
    run: QueuedRun | None = None
    last_seq: int | None = None
    """``claimed``: the number of the run's latest event (the holder numbers the next ones);
    ``None`` when the claim did not read it."""
    timed: bool = True
    """``claimed``: whether the run may have a deadline (``False``: none was submitted, so
    the claim skips ``start_deadline``)."""


@dataclass(slots=True)
class Batch:
    """What one attempt has to write since its last fenced transaction: journal entries
    (key → state, payload), events numbered by the lease holder, and trail records. Written
    in one transaction (``RunStore.write_batch``, or with the run's ending or its approval)."""

    entries: dict[str, tuple[str, Any]] = dataclasses.field(default_factory=dict)
    events: list[tuple[int, dict[str, Any]]] = dataclasses.field(default_factory=list)
    records: list[AuditRecord] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.entries or self.events or self.records)


def _now() -> int:
    return time.time_ns()


def dumps(value: Any) -> str:
    """JSON for the store: non-JSON values become their ``str`` (as results do on the wire).
    ASCII with escapes, so that what a model or a tool wrote (a lone surrogate, a NUL) is kept
    exactly and never refused by the database's text encoding."""
    return json.dumps(value, ensure_ascii=True, default=str)


class RunStore:
    """The queued runs of one SQL store (see the module docstring)."""

    def __init__(self, storage: SqlStorage, *, max_redeliveries: int = 3) -> None:
        if not isinstance(storage, SqlStorage):
            raise StorageError(
                "queued runs need a SQL store (storage.url: postgresql+psycopg://... for "
                "workers on several machines, or a sqlite:/// file on one machine)"
            )
        self.storage = storage
        self.max_redeliveries = max_redeliveries
        with storage.transaction(write=True) as conn:
            if conn.dialect.name == "postgresql":  # workers starting together: one creates
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _TABLES_LOCK})
            metadata.create_all(conn, checkfirst=True)

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Connection]:
        with self.storage.transaction(write=write) as conn:
            yield conn

    # -- submitting -------------------------------------------------------------------

    def add(
        self,
        session_id: str,
        request: dict[str, Any],
        *,
        owner: str = "",
        request_id: str | None = None,
        run_timeout_s: float | None = None,
    ) -> str:
        """Record a run to be queued; returns its request id. ``run_timeout_s``: the run
        ends ``timed_out`` once that long has passed since a worker first started it."""
        check_session_id(session_id, self.storage.max_id_length)  # refused before it queues
        request_id = request_id or str(uuid.uuid4())
        now = _now()
        with self._tx() as conn:
            conn.execute(
                insert(runs_table).values(
                    request_id=request_id,
                    session_id=session_id,
                    owner=owner,
                    request=dumps(request),
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
                conn.execute(
                    insert(journal_table).values(
                        request_id=request_id,
                        key=LIMITS_KEY,
                        state="done",
                        payload=dumps({"run_timeout_s": float(run_timeout_s)}),
                        token=0,
                        updated_ns=now,
                    )
                )
        return request_id

    def get(self, request_id: str) -> QueuedRun | None:
        with self._tx(write=False) as conn:
            row = conn.execute(
                select(runs_table).where(runs_table.c.request_id == request_id)
            ).first()
        return _run(row) if row is not None else None

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
            return [_run(row) for row in conn.execute(query)]

    # -- claiming ---------------------------------------------------------------------

    def claim(self, request_id: str, worker: str, lease_ttl: float) -> Claim:
        """Take the run for ``worker`` if it may run now (see ``Claim.outcome``):

        - ``finished``: done already (a second delivery of a finished run);
        - ``waiting``: it waits for an approval (the answer re-enqueues it);
        - ``parked``: an older run of its session has not finished (its end hands over);
        - ``busy``: another worker holds a live lease on it;
        - ``dead``: it was lost with its worker more than ``max_redeliveries`` times;
        - ``claimed``: it is this worker's, with a new fencing token.
        """
        fast = self._claim_queued(request_id, worker, lease_ttl)
        if fast is not None:
            return fast
        now = _now()
        r = runs_table.c
        with self._tx() as conn:
            row = conn.execute(
                select(runs_table).where(r.request_id == request_id).with_for_update()
            ).first()
            if row is None:
                return Claim("finished")
            run = _run(row)
            if run.finished:
                return Claim("finished", run=run)
            if run.status == "waiting_approval":
                return Claim("waiting", run=run)
            older = conn.execute(
                select(func.count())
                .select_from(runs_table)
                .where(
                    r.session_id == run.session_id,
                    r.status.not_in(FINISHED),
                    (r.created_ns < run.created_ns)
                    | and_(r.created_ns == run.created_ns, r.request_id < run.request_id),
                )
            ).scalar_one()
            if older:
                conn.execute(
                    update(runs_table)
                    .where(r.request_id == request_id)
                    .values(parked=True, delivered_ns=None)
                )
                return Claim("parked", run=run)
            if run.status == "running" and (run.lease_expires_ns or 0) > now:
                return Claim("busy", heartbeat_ns=run.heartbeat_ns, run=run)
            taken_over = run.status == "running"  # its holder died (its lease expired)
            redeliveries = run.redeliveries + (1 if taken_over else 0)
            if redeliveries > self.max_redeliveries:
                error = (
                    f"{redeliveries} attempts of the run ended without an ending (its worker "
                    f"died, froze or lost its store; max_redeliveries {self.max_redeliveries}); "
                    "dead-lettered — `hermes-agent runs requeue` puts it back"
                )
                conn.execute(
                    update(runs_table)
                    .where(r.request_id == request_id)
                    .values(
                        status="dead",
                        updated_ns=now,
                        lease_owner=None,
                        lease_expires_ns=None,
                        error=error,
                    )
                )
                _end(conn, run.request_id, run.session_id, "dead", error)
                return Claim("dead", run=run)
            token = run.lease_token + 1
            conn.execute(
                update(runs_table)
                .where(r.request_id == request_id)
                .values(
                    status="running",
                    parked=False,
                    delivered_ns=None,
                    claims=run.claims + 1,
                    redeliveries=redeliveries,
                    lease_token=token,
                    lease_owner=worker,
                    lease_expires_ns=now + int(lease_ttl * 1e9),
                    heartbeat_ns=now,
                    updated_ns=now,
                )
            )
        return Claim("claimed", token=token, resumed=run.claims > 0, run=run)

    def _claim_queued(self, request_id: str, worker: str, lease_ttl: float) -> Claim | None:
        """The common case in one statement: a ``queued`` run with nothing older unfinished
        in its session becomes this worker's (its delivery noted by the same update), and the
        statement returns the row, the number of its latest event and whether it was
        submitted with a deadline. ``None``: any other case (the full claim decides)."""
        now = _now()
        r = runs_table.c
        older = runs_table.alias("older")
        o = older.c
        e, j = events_table.c, journal_table.c
        statement = (
            update(runs_table)
            .where(
                r.request_id == request_id,
                r.status == "queued",
                ~select(o.request_id)
                .where(
                    o.session_id == r.session_id,
                    o.status.not_in(FINISHED),
                    (o.created_ns < r.created_ns)
                    | and_(o.created_ns == r.created_ns, o.request_id < r.request_id),
                )
                .exists(),
            )
            .values(
                status="running",
                parked=False,
                delivered_ns=None,
                claims=r.claims + 1,
                lease_token=r.lease_token + 1,
                lease_owner=worker,
                lease_expires_ns=now + int(lease_ttl * 1e9),
                heartbeat_ns=now,
                updated_ns=now,
            )
            .returning(
                *runs_table.c,
                select(func.coalesce(func.max(e.seq), 0))
                .where(e.request_id == request_id)
                .scalar_subquery()
                .label("last_seq"),
                select(func.count())
                .select_from(journal_table)
                .where(j.request_id == request_id, j.key.in_([LIMITS_KEY, DEADLINE_KEY]))
                .scalar_subquery()
                .label("limits"),
            )
        )
        with self._tx() as conn:
            row = conn.execute(statement).first()
        if row is None:
            return None
        run = _run(row)
        # The row as it was before this claim, as the full claim reports it.
        run.status, run.claims, run.lease_token = "queued", run.claims - 1, run.lease_token - 1
        return Claim(
            "claimed",
            token=run.lease_token + 1,
            resumed=run.claims > 0,
            run=run,
            last_seq=int(row.last_seq),
            timed=bool(row.limits),
        )

    def mark_delivered(self, request_id: str) -> None:
        """A worker received a delivery of this queued run (it may wait for a free slot before
        it claims it). A delivery that is never claimed — its worker died holding it, which the
        Redis broker would give back only after its visibility timeout — is sent again by the
        sweeper."""
        r = runs_table.c
        with self._tx() as conn:
            conn.execute(
                update(runs_table)
                .where(r.request_id == request_id, r.status == "queued", r.delivered_ns.is_(None))
                .values(delivered_ns=_now())
            )

    def heartbeat(self, request_id: str, token: int, lease_ttl: float) -> bool:
        """Extend the lease; ``False`` when it is no longer this token's (stop at once)."""
        now = _now()
        r = runs_table.c
        with self._tx() as conn:
            done = conn.execute(
                update(runs_table)
                .where(r.request_id == request_id, r.lease_token == token, r.status == "running")
                .values(lease_expires_ns=now + int(lease_ttl * 1e9), heartbeat_ns=now)
            )
        return done.rowcount == 1

    def _fence(self, conn: Connection, request_id: str, token: int) -> None:
        """Hold the run's row for this transaction, or raise ``LeaseLost``."""
        r = runs_table.c
        held = conn.execute(
            select(r.lease_token, r.status).where(r.request_id == request_id).with_for_update()
        ).first()
        if held is None or held.lease_token != token or held.status != "running":
            raise LeaseLost(f"run {request_id}: the lease passed to another worker")

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
        now = _now()
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

    def write_batch(self, request_id: str, token: int, batch: Batch) -> None:
        """Write ``batch`` in one transaction fenced by ``token`` (a model turn of the run:
        its journal entries, events and trail records)."""
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            _write_batch(conn, request_id, token, batch)

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
    ) -> None:
        """End the run (``completed``, ``failed``, ``timed_out``), in one fenced transaction
        with everything its ending consists of: ``turn`` added to its session (once), the
        trail's one ending — ``output`` (the answer's record) for a completed run, a
        ``stopped`` record otherwise — numbered after every other record of the run, and
        ``event``, its last event. So a run is final exactly when its trail has its ending
        and its followers their last event, and a store that fails in between leaves none
        of them (the attempt ends, and the run resumes)."""
        r = runs_table.c
        with self._tx() as conn:
            row = conn.execute(
                select(r.lease_token, r.status, r.session_id, r.turn_saved)
                .where(r.request_id == request_id)
                .with_for_update()
            ).first()
            if row is None or row.lease_token != token or row.status != "running":
                raise LeaseLost(f"run {request_id}: the lease passed to another worker")
            if batch:
                _write_batch(conn, request_id, token, batch)
            if turn and not row.turn_saved:
                append_messages(conn, row.session_id, turn)
            conn.execute(
                update(runs_table)
                .where(r.request_id == request_id)
                .values(
                    status=status,
                    updated_ns=_now(),
                    lease_owner=None,
                    lease_expires_ns=None,
                    result=dumps(result) if result is not None else None,
                    error=error,
                    turn_saved=bool(turn) or row.turn_saved,
                )
            )
            if status == "completed" and output is not None:
                _add_record(conn, output)
            elif status != "completed":
                _end(conn, request_id, row.session_id, status, error, add_event=event is None)
            if event is not None:
                if batch is not None and batch.events:  # numbered after the holder's own
                    seq = batch.events[-1][0] + 1
                    conn.execute(
                        insert(events_table).values(
                            request_id=request_id, seq=seq, payload=dumps(event)
                        )
                    )
                else:
                    _add_event(conn, request_id, event)

    def write_records(self, request_id: str, token: int, records: Sequence[AuditRecord]) -> None:
        """Add records of the run's trail, fenced by ``token`` (a copy of the run that lost
        its lease adds nothing more to the trail)."""
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            if records:
                conn.execute(insert(audit_table), [dataclasses.asdict(r) for r in records])

    def add_fenced_event(self, request_id: str, token: int, wire: dict[str, Any]) -> int:
        """Append an event of the run's pipeline, fenced by ``token``."""
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            return _add_event(conn, request_id, wire)

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

    def release(self, request_id: str, token: int) -> None:
        """Give the run back to the queue (a worker shutting down mid-run)."""
        r = runs_table.c
        with self._tx() as conn:
            conn.execute(
                update(runs_table)
                .where(r.request_id == request_id, r.lease_token == token, r.status == "running")
                .values(status="queued", lease_owner=None, lease_expires_ns=None, updated_ns=_now())
            )

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
                    updated_ns=_now(),
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
                _end(conn, request_id, session, "cancelled", reason)
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
            # Its deadline starts again with its next attempt.
            conn.execute(
                delete(journal_table).where(
                    journal_table.c.request_id == request_id, journal_table.c.key == DEADLINE_KEY
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
                    updated_ns=_now(),
                    parked=False,
                )
            )
        found = self.get(request_id)
        assert found is not None
        return found

    def next_of_session(self, session_id: str) -> str | None:
        """The oldest unfinished run of a session that is parked (waiting for its turn)."""
        r = runs_table.c
        with self._tx(write=False) as conn:
            row = conn.execute(
                select(r.request_id, r.parked)
                .where(r.session_id == session_id, r.status.not_in(FINISHED))
                .order_by(r.created_ns, r.request_id)
                .limit(1)
            ).first()
        return row.request_id if row is not None and row.parked else None

    def to_sweep(self, lease_ttl: float) -> list[str]:
        """Runs that need a new delivery, each claimed for requeueing by one sweeper only:
        running runs whose lease expired (their worker died), parked runs whose session
        has nothing older unfinished (their hand-over was lost), queued runs delivered to a
        worker that never claimed them within three leases (it died holding the delivery), and
        queued runs nobody took within ten leases (a delivery lost without a trace)."""
        now = _now()
        r = runs_table.c
        quiet = now - int(lease_ttl * 1e9)
        found: list[str] = []
        with self._tx() as conn:
            unclaimed = now - int(3 * lease_ttl * 1e9)
            forgotten = now - int(10 * lease_ttl * 1e9)
            rows = conn.execute(
                select(r.request_id, r.session_id, r.status, r.created_ns, r.parked)
                .where(
                    ((r.status == "running") & (r.lease_expires_ns < now))
                    | ((r.status == "queued") & r.parked)
                    | ((r.status == "queued") & (r.delivered_ns < unclaimed))
                    # The last resort: a delivery lost without a trace (its worker died before
                    # it could note it). A run still waiting in a long queue gets a duplicate,
                    # which its claim makes harmless.
                    | (
                        (r.status == "queued")
                        & r.delivered_ns.is_(None)
                        & (func.coalesce(r.requeued_ns, r.updated_ns) < forgotten)
                    ),
                    (r.requeued_ns.is_(None)) | (r.requeued_ns < quiet),
                )
                .limit(200)
            ).all()
            for row in rows:
                if row.status == "queued" and row.parked:
                    older = conn.execute(
                        select(func.count())
                        .select_from(runs_table)
                        .where(
                            r.session_id == row.session_id,
                            r.status.not_in(FINISHED),
                            r.created_ns < row.created_ns,
                        )
                    ).scalar_one()
                    if older:
                        continue
                claimed = conn.execute(
                    update(runs_table)
                    .where(
                        r.request_id == row.request_id,
                        (r.requeued_ns.is_(None)) | (r.requeued_ns < quiet),
                    )
                    .values(requeued_ns=now, delivered_ns=None)
                )
                if claimed.rowcount == 1:
                    found.append(row.request_id)
        return found

    # -- events -----------------------------------------------------------------------

    def add_event(self, request_id: str, wire: dict[str, Any]) -> int:
        with self._tx() as conn:
            return _add_event(conn, request_id, wire)

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
        now = _now()
        with self._tx() as conn:
            self._fence(conn, request_id, token)
            if batch:  # the turn that asked, and what the attempt did before it
                _write_batch(conn, request_id, token, batch)
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
                _add_event(conn, request_id, event)

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

    def decide(self, request_id: str, key: str, approved: bool, reason: str | None) -> bool:
        """Answer a pending approval and put its run back in the queue (``True`` when there
        was such a pending approval). The caller enqueues the run."""
        a = approvals_table.c
        r = runs_table.c
        with self._tx() as conn:
            done = conn.execute(
                update(approvals_table)
                .where(a.request_id == request_id, a.key == key, a.status == "pending")
                .values(
                    status="approved" if approved else "denied", reason=reason, updated_ns=_now()
                )
            )
            if done.rowcount != 1:
                return False
            conn.execute(
                update(runs_table)
                .where(r.request_id == request_id, r.status == "waiting_approval")
                .values(status="queued", updated_ns=_now(), delivered_ns=None)
            )
            verdict = reason or ("approved" if approved else "denied")
            _add_event(conn, request_id, ApprovalResolvedEvent(key, approved, verdict).to_dict())
        return True


def _upsert(conn: Connection, table: Table, rows: list[dict[str, Any]], keys: list[str]) -> None:
    """Insert ``rows``, replacing those whose ``keys`` are there already, in one statement."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as upsert
    else:
        from sqlalchemy.dialects.sqlite import insert as upsert  # type: ignore[assignment]
    statement = upsert(table)
    changed = {c: statement.excluded[c] for c in rows[0] if c not in keys}
    conn.execute(statement.on_conflict_do_update(index_elements=keys, set_=changed), rows)


def _write_batch(conn: Connection, request_id: str, token: int, batch: Batch) -> None:
    """A batch's writes, inside the caller's fenced transaction: one statement per table."""
    now = _now()
    if batch.entries:
        _upsert(
            conn,
            journal_table,
            [
                {
                    "request_id": request_id,
                    "key": key,
                    "state": state,
                    "payload": dumps(payload),
                    "token": token,
                    "updated_ns": now,
                }
                for key, (state, payload) in batch.entries.items()
            ],
            ["request_id", "key"],
        )
    if batch.events:
        conn.execute(
            insert(events_table),
            [
                {"request_id": request_id, "seq": seq, "payload": dumps(wire)}
                for seq, wire in batch.events
            ],
        )
    if batch.records:
        conn.execute(insert(audit_table), [dataclasses.asdict(r) for r in batch.records])


def _add_record(conn: Connection, record: AuditRecord) -> None:
    """Add the trail's ending, numbered after every record the trail holds."""
    a = audit_table.c
    latest = conn.execute(select(func.max(a.seq)).where(a.request_id == record.request_id)).scalar()
    if latest is not None and record.seq <= latest:
        record = dataclasses.replace(record, seq=int(latest) + 1)
    conn.execute(insert(audit_table).values(**dataclasses.asdict(record)))


def _end(
    conn: Connection,
    request_id: str,
    session_id: str,
    status: str,
    error: str | None,
    *,
    add_event: bool = True,
) -> None:
    """The ending of a run that ended without an answer, inside the transaction that ends it:
    a ``stopped`` record last in its trail and a ``run_stopped`` event last in its log."""
    a = audit_table.c
    last = conn.execute(
        select(audit_table).where(a.request_id == request_id).order_by(a.seq.desc()).limit(1)
    ).first()
    earlier = []
    if last is not None:
        fields = {f.name for f in dataclasses.fields(AuditRecord)}
        earlier.append(AuditRecord(**{k: v for k, v in last._mapping.items() if k in fields}))
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
    conn.execute(insert(audit_table).values(**dataclasses.asdict(record)))
    if add_event:
        _add_event(conn, request_id, RunStoppedEvent(status, error).to_dict())


def _add_event(conn: Connection, request_id: str, wire: dict[str, Any]) -> int:
    """Append one event to a run's log, inside the caller's transaction."""
    e = events_table.c
    r = runs_table.c
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


def _run(row: Any) -> QueuedRun:
    return QueuedRun(
        request_id=row.request_id,
        session_id=row.session_id,
        owner=row.owner,
        request=json.loads(row.request),
        status=row.status,
        created_ns=row.created_ns,
        updated_ns=row.updated_ns,
        claims=row.claims,
        redeliveries=row.redeliveries,
        lease_token=row.lease_token,
        lease_owner=row.lease_owner,
        lease_expires_ns=row.lease_expires_ns,
        heartbeat_ns=row.heartbeat_ns,
        result=json.loads(row.result) if row.result else None,
        error=row.error,
    )


def request_payload(
    message: str,
    *,
    tool_choice: str | None = None,
    toolsets: list[str] | None = None,
    output_format: str | None = None,
    channel: str | None = None,
    output_schema: dict[str, Any] | None = None,
    trace_context: Mapping[str, str] | None = None,
    client: ClientTools | None = None,
    variables: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a queued run keeps of its request: a ``QueuedRequest`` as JSON, with the
    submitter's trace context (given by the submitter, which knows whether it traces)."""
    return QueuedRequest(
        message=message,
        tool_choice=tool_choice,
        toolsets=toolsets,
        output_format=output_format,
        channel=channel,
        output_schema=output_schema,
        trace_context=dict(trace_context or {}),
        client=client,
        variables=variables,
    ).model_dump(mode="json")
