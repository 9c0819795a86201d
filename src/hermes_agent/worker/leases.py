"""Who runs a queued run: the lease layer of ``worker.store.RunStore``.

A worker claims a run (``claim``), which gives it a fencing token that grows with each claim,
and holds it while its heartbeats extend the lease (``heartbeat``); a run whose lease expired
(its worker died) is taken over by the next claim, and the sweeper finds the runs whose
delivery was lost (``to_sweep``). Every write of an attempt is fenced (``_fence``): it lands only
while the writer's token is the run's current one, else ``LeaseLost``.

Leases are counted on the store's clock (``store_now_ns``), read when a statement runs: a
heartbeat held up by a paused store extends the lease from when the store ran it, not from
when it was sent, so a pause does not leave every lease it held up expired when it ends.

A takeover charges the run a redelivery only when the lapse was its own doing
(``_charge_for_lapse``): a worker that died inside one run's tool call is charged to that run;
the runs beside it are redelivered free.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    BigInteger,
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
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.functions import FunctionElement

from hermes_agent.storage.base import StorageError
from hermes_agent.storage.schema import events_table, journal_table, messages_table, runs_table
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.storage.statements import HEARTBEAT, POSTGRESQL_NOW, Write, insert_rows
from hermes_agent.worker.run_rows import (
    DEADLINE_KEY,
    FINISHED,
    LIMITS_KEY,
    Claim,
    LeaseLost,
    QueuedRun,
    dumps,
    now_ns,
    queued_run,
)
from hermes_agent.worker.run_writes import fenced, write_ending

LAPSE_KEY = "lapse"
"""The journal entry noting how an attempt's lease lapsed: whether it was inside a tool call,
and whether other runs of its worker were (``LeasedRuns._note_lapse``)."""
STRIKES_KEY = "strikes"
"""The journal entry counting the run's deaths inside a tool call that another run's call
shared: not charged yet, and its calls run alone in their process until one is."""


class store_now_ns(FunctionElement[int]):  # a SQL function, named as one
    """PostgreSQL's clock, in ns since the epoch, read when the statement runs."""

    type = BigInteger()
    inherit_cache = True
    name = "store_now_ns"


@compiles(store_now_ns, "postgresql")
def _postgresql_now(element: store_now_ns, compiler: SQLCompiler, **kw: Any) -> str:
    return POSTGRESQL_NOW


def store_now(conn: Connection) -> Any:
    """The store's clock for a statement about to run in ``conn``'s transaction: PostgreSQL's
    own, read as the statement runs; SQLite's is the worker's (it runs in this process, and
    its transaction holds the write lock already), read now, to the nanosecond."""
    return store_now_ns() if conn.dialect.name == "postgresql" else now_ns()


def renewed(lease_ttl: float, conn: Connection) -> dict[str, Any]:
    """The values of a lease extended by ``lease_ttl`` from when the statement runs."""
    now = store_now(conn)
    return {"lease_expires_ns": now + int(lease_ttl * 1e9), "heartbeat_ns": now}


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
            r.redeliveries <= bindparam("p_max"),  # else the full claim dead-letters it
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
_CLAIM_QUEUED = _claim_queued_statement()


def _found(row: Any) -> bool:
    return row is not None


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

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Connection]:
        with self.storage.driver.core(write=write) as conn:
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
        r = runs_table.c
        with self._tx() as conn:
            # The store's clock decides whether a lease ran out (as it extends them).
            now = store_now(conn)
            if not isinstance(now, int):
                now = int(conn.execute(select(now)).scalar_one())
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
            charge = self._charge_for_lapse(conn, run, now) if taken_over else 0
            redeliveries = run.redeliveries + charge
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
            "p_max": self.max_redeliveries,
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
        """Extend the lease by ``lease_ttl`` from when the store runs this (its clock, read
        once the run's row is locked); ``False`` when it is no longer this token's (stop at
        once)."""
        if self.storage.engine.dialect.name == "postgresql":
            bound = {"p_request_id": request_id, "p_token": token, "p_ttl_ns": int(lease_ttl * 1e9)}
            write = Write(statement=HEARTBEAT, params=bound, read=_found)
        else:

            def steps(conn: Connection) -> bool:  # SQLite: the lock is taken before the clock
                r = runs_table.c
                done = conn.execute(
                    update(runs_table)
                    .where(
                        r.request_id == request_id, r.lease_token == token, r.status == "running"
                    )
                    .values(**renewed(lease_ttl, conn))
                )
                return done.rowcount == 1

            write = Write(core=steps)
        return self.storage.driver.write(write)

    def _fence(self, conn: Connection, request_id: str, token: int) -> None:
        """Hold the run's row for this transaction, or raise ``LeaseLost``."""
        if fenced(conn, request_id, token) is None:
            raise LeaseLost(f"run {request_id}: the lease passed to another worker")

    def release(self, request_id: str, token: int, *, charge: bool = False) -> None:
        """Give the run back to the queue (a worker shutting down mid-run, an attempt that lost
        its store); ``charge``: the attempt failed for a reason of the run's own (a write the
        store refuses for good), which costs it a redelivery as a death would."""
        r = runs_table.c
        values: dict[str, Any] = {
            "status": "queued",
            "lease_owner": None,
            "lease_expires_ns": None,
            "updated_ns": now_ns(),
        }
        if charge:
            values["redeliveries"] = r.redeliveries + 1
        with self._tx() as conn:
            conn.execute(
                update(runs_table)
                .where(r.request_id == request_id, r.lease_token == token, r.status == "running")
                .values(**values)
            )

    # -- who pays for a lapse ---------------------------------------------------------

    def _charge_for_lapse(self, conn: Connection, run: QueuedRun, now: int) -> int:
        """The redeliveries a takeover of ``run`` charges it (its lease lapsed: its worker
        died, froze, or lost the store):

        - inside a tool call, and no other run of that worker was: the call is the likely
          cause — one, plus the strikes it had not been charged yet;
        - inside a tool call beside another run's call: either may have been the cause, so
          neither is charged; each gets a strike, and its calls run alone in their process
          from now on (``worker.journal.CallGate``), so that its next death is its own;
        - not inside a tool call: one if it was its worker's only run, else none (the
          worker died of something else; a run of its own would have been inside a call).
        """
        j = journal_table.c
        noted = {
            row.key: json.loads(row.payload)
            for row in conn.execute(
                select(j.key, j.payload).where(
                    j.request_id == run.request_id, j.key.in_([LAPSE_KEY, STRIKES_KEY])
                )
            )
        }
        facts = noted.get(LAPSE_KEY)
        if (
            facts is None
            or facts["token"] != run.lease_token
            or (run.heartbeat_ns or 0) > facts["at"]  # noted while its attempt still lived
        ):
            facts = self._note_lapse(conn, run, now)
        strikes = int(noted.get(STRIKES_KEY, {}).get("n", 0))
        if facts["in_call"] and not facts["others_in_call"]:
            charge, left = 1 + strikes, 0
        elif facts["in_call"]:
            charge, left = 0, strikes + 1
        else:
            charge, left = (0 if facts["others"] else 1), strikes
        if left != strikes:
            put_entry(conn, run.request_id, STRIKES_KEY, {"n": left}, run.lease_token, now)
        return charge

    def _note_lapse(self, conn: Connection, run: QueuedRun, now: int) -> dict[str, Any]:
        """What every run ``run``'s worker holds was doing, noted for each of them at the
        first takeover of one: by the time the next is taken over, the runs already taken
        over no longer name that worker. A run whose worker lives on shows it by its next
        heartbeat, which makes its note stale."""
        r, j = runs_table.c, journal_table.c
        in_call = (
            select(j.key)
            .where(
                j.request_id == r.request_id,
                j.token == r.lease_token,
                j.state == "started",
                j.key.like("call/%"),
            )
            .exists()
        )
        held = (
            r.lease_owner == run.lease_owner
            if run.lease_owner is not None
            else r.request_id == run.request_id
        )
        # The notes are written in one order, so that concurrent takeovers of the same
        # worker's runs wait for each other instead of deadlocking.
        rows = conn.execute(
            select(r.request_id, r.lease_token, in_call.label("in_call"))
            .where(r.status == "running", held)
            .order_by(r.request_id)
        ).all()
        calling = {row.request_id for row in rows if row.in_call}
        mine: dict[str, Any] = {"token": run.lease_token, "in_call": False, "at": now}
        for row in rows:
            facts = {
                "token": row.lease_token,
                "in_call": row.request_id in calling,
                "others_in_call": len(calling - {row.request_id}),
                "others": len(rows) - 1,
                "at": now,
            }
            if row.request_id == run.request_id:
                mine = facts
            else:
                put_entry(conn, row.request_id, LAPSE_KEY, facts, row.lease_token, now)
        mine.setdefault("others_in_call", len(calling))
        mine.setdefault("others", len(rows))
        return mine

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
                    ((r.status == "running") & (r.lease_expires_ns < store_now(conn)))
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


def put_entry(
    conn: Connection, request_id: str, key: str, payload: Any, token: int, now: int
) -> None:
    """Insert or replace one journal entry of the store's own (not fenced: the claim's)."""
    row = {
        "request_id": request_id,
        "key": key,
        "state": "done",
        "payload": dumps(payload),
        "token": token,
        "updated_ns": now,
    }
    insert_rows(conn, journal_table, [row])
