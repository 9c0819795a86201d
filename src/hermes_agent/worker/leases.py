"""Who runs a queued run: the lease layer of ``worker.store.RunStore``.

A worker claims a run (``claim``), which gives it a fencing token that grows with each claim,
and holds it while its heartbeats extend the lease (``heartbeat``); a run whose lease expired
(its worker died) is taken over by the next claim, and the sweeper finds the runs whose
delivery was lost (``to_sweep``). Every write of an attempt is fenced (``_fence``): it lands only
while the writer's token is the run's current one, else ``LeaseLost``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Select,
    and_,
    bindparam,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.sql.dml import ReturningUpdate

from hermes_agent.storage.base import StorageError
from hermes_agent.storage.schema import events_table, journal_table, messages_table, runs_table
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.worker.run_rows import (
    DEADLINE_KEY,
    FINISHED,
    LIMITS_KEY,
    Claim,
    LeaseLost,
    now_ns,
    queued_run,
)
from hermes_agent.worker.run_writes import write_ending

# The statements every run makes, built once: building one (and computing its cache key)
# costs more CPU than PostgreSQL spends running it. Their values are bound at execution.


def constants(values: tuple[str, ...]) -> list[ColumnElement[Any]]:
    """``values`` written into a statement built once, for ``IN``: an ``IN`` over bound
    values is rendered again at every execution (SQLAlchemy's expanding parameters). Only
    the module's own names, which hold no quote."""
    if not all(value.isidentifier() for value in values):
        raise ValueError(f"not a plain name: {values!r}")
    return [literal_column(f"'{value}'") for value in values]


FINISHED_SQL = constants(FINISHED)


def _next_parked_statement() -> Select[Any]:
    r = runs_table.c
    return (
        select(r.request_id, r.parked)
        .where(r.session_id == bindparam("p_session_id"), r.status.not_in(FINISHED_SQL))
        .order_by(r.created_ns, r.request_id)
        .limit(1)
    )


def _fence_statement() -> Select[Any]:
    r = runs_table.c
    return (
        select(r.lease_token, r.status)
        .where(r.request_id == bindparam("p_request_id"))
        .with_for_update()
    )


def _claim_queued_statement() -> ReturningUpdate[Any]:
    r = runs_table.c
    older = runs_table.alias("older")
    o = older.c
    e, j, m = events_table.c, journal_table.c, messages_table.c
    request_id: BindParameter[Any] = bindparam("p_request_id")
    now: BindParameter[Any] = bindparam("p_now")
    return (
        update(runs_table)
        .where(
            r.request_id == request_id,
            r.status == "queued",
            ~select(o.request_id)
            .where(
                o.session_id == r.session_id,
                o.status.not_in(FINISHED_SQL),
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
            lease_owner=bindparam("p_worker"),
            lease_expires_ns=bindparam("p_expires"),
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
            .where(j.request_id == request_id, j.key.in_(constants((LIMITS_KEY, DEADLINE_KEY))))
            .scalar_subquery()
            .label("limits"),
            # Whether the session holds any message: a run that starts one reads no history.
            # The run's column is named with its table: SQLite writes the columns of an
            # UPDATE's RETURNING bare, and a bare session_id here would be the message's own.
            select(m.session_id)
            .where(m.session_id == literal_column(f"{runs_table.name}.session_id"))
            .exists()
            .label("history"),
        )
    )


_NEXT_PARKED = _next_parked_statement()
_FENCE = _fence_statement()
_CLAIM_QUEUED = _claim_queued_statement()


def next_parked(conn: Connection, session_id: str) -> str | None:
    """The oldest unfinished run of a session, if it is parked (waiting for its turn)."""
    row = conn.execute(_NEXT_PARKED, {"p_session_id": session_id}).first()
    return row.request_id if row is not None and row.parked else None


class LeasedRuns:
    """The queued runs of one SQL store, as far as leases go (claims, heartbeats, hand-backs,
    the sweep); ``RunStore`` adds the rest."""

    def __init__(self, storage: SqlStorage, *, max_redeliveries: int = 3) -> None:
        if not isinstance(storage, SqlStorage):
            raise StorageError(
                "queued runs need a SQL store (storage.url: postgresql+psycopg://... for "
                "workers on several machines, or a sqlite:/// file on one machine)"
            )
        # The tables are there: the storage applied the schema's migrations when it opened.
        self.storage = storage
        self.max_redeliveries = max_redeliveries
        # On PostgreSQL a model turn's batch and a completed run's ending are one statement
        # each (worker.fenced_statements): a round trip where a transaction costs five to ten.
        self._single_statements = storage.engine.dialect.name == "postgresql"

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Connection]:
        with self.storage.transaction(write=write) as conn:
            yield conn

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
        now = now_ns()
        r = runs_table.c
        with self._tx() as conn:
            row = conn.execute(
                select(runs_table).where(r.request_id == request_id).with_for_update()
            ).first()
            if row is None:
                return Claim("finished")
            run = queued_run(row)
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
                write_ending(conn, run.request_id, run.session_id, "dead", error)
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
        statement returns the row, the number of its latest event, whether it was submitted
        with a deadline and whether its session holds any message yet. ``None``: any other
        case (the full claim decides)."""
        now = now_ns()
        bound = {
            "p_request_id": request_id,
            "p_worker": worker,
            "p_expires": now + int(lease_ttl * 1e9),
            "p_now": now,
        }
        # One statement (atomic on its own): no transaction around it to pay for.
        row = self.storage.write_at_once(_CLAIM_QUEUED, bound)
        if row is None:
            return None
        run = queued_run(row)
        # The row as it was before this claim, as the full claim reports it.
        run.status, run.claims, run.lease_token = "queued", run.claims - 1, run.lease_token - 1
        return Claim(
            "claimed",
            token=run.lease_token + 1,
            resumed=run.claims > 0,
            run=run,
            last_seq=int(row.last_seq),
            timed=bool(row.limits),
            history=bool(row.history),
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
                .values(delivered_ns=now_ns())
            )

    def heartbeat(self, request_id: str, token: int, lease_ttl: float) -> bool:
        """Extend the lease; ``False`` when it is no longer this token's (stop at once)."""
        now = now_ns()
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
        held = conn.execute(_FENCE, {"p_request_id": request_id}).first()
        if held is None or held.lease_token != token or held.status != "running":
            raise LeaseLost(f"run {request_id}: the lease passed to another worker")

    def release(self, request_id: str, token: int) -> None:
        """Give the run back to the queue (a worker shutting down mid-run)."""
        r = runs_table.c
        with self._tx() as conn:
            conn.execute(
                update(runs_table)
                .where(r.request_id == request_id, r.lease_token == token, r.status == "running")
                .values(
                    status="queued", lease_owner=None, lease_expires_ns=None, updated_ns=now_ns()
                )
            )

    def next_of_session(self, session_id: str) -> str | None:
        """The oldest unfinished run of a session that is parked (waiting for its turn)."""
        with self._tx(write=False) as conn:
            return next_parked(conn, session_id)

    def to_sweep(self, lease_ttl: float) -> list[str]:
        """Runs that need a new delivery, each claimed for requeueing by one sweeper only:
        running runs whose lease expired (their worker died), parked runs whose session
        has nothing older unfinished (their hand-over was lost), queued runs delivered to a
        worker that never claimed them within three leases (it died holding the delivery), and
        queued runs nobody took within ten leases (a delivery lost without a trace)."""
        now = now_ns()
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
