"""Queued runs in the service (``execution: queue``): ``POST /v1/runs`` puts the run on the
Celery queue of the config's ``queue:`` section and answers ``202`` at once; any worker runs it
(``hermes_agent.worker``), and the run's state and events are read back from the SQL store the
workers write, so every instance of the service can answer for every run.

    service:
      execution: queue
    queue:
      broker: redis://127.0.0.1:6379/0
    storage:
      url: postgresql+psycopg://hermes@db/hermes

What the endpoints do with a queued run:

- ``POST /v1/runs``: the same request, size limits, limits on runs in flight (counted in the
  store: ``queued`` and ``running`` runs, of every instance; a run waiting for an approval holds
  no worker and does not count) and daily quota; then ``202`` with ``request_id``, ``status``
  and the URLs to follow it. ``stream: true`` streams its events instead.
- ``GET /v1/runs/{id}``: the run's row (status, result, error, attempts, pending approvals);
  ``GET /v1/runs/{id}/events``: its events from the store, polled every ``POLL_S`` seconds,
  with keep-alives and ``Last-Event-ID``, until ``result`` or ``run_stopped``.
- ``POST /v1/runs/{id}/cancel``: the run is marked cancelled; its worker stops at its next
  heartbeat; the answer names the calls its journal shows started and not finished
  (``still_running``: a sync tool on the worker runs to its end). ``POST /v1/approvals/{id}``
  and ``GET /v1/approvals``: a queued run that needs an approval is set aside (its worker is
  freed) until its owner answers; the answer puts it back on the queue.

An approval of a queued run is named, on the API, by its run and its key in the store
(``approval_ref``), so that the id alone finds it from any instance. Someone else's run or
approval is a 404, as in process.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, case, func, select

from hermes_agent.config import HermesConfig
from hermes_agent.errors import ConfigError
from hermes_agent.runs.backend import ApprovalConflict, Item, LocalWork, RunNotFound, RunView
from hermes_agent.runs.events import (
    END_EVENTS,
    ApprovalRequiredEvent,
    ApprovalResolvedEvent,
    RunStoppedEvent,
    StoredResultEvent,
    read_known,
    result_wire,
)
from hermes_agent.runs.gate import RunRejected, Tally, admitted_here, cut_mid_turn, tokens_used
from hermes_agent.runs.principal import Principal, client_session_id, stored_session_id
from hermes_agent.runs.request import QueuedRequest, RunRequest
from hermes_agent.runs.settings import ServiceSettings
from hermes_agent.storage.base import Storage
from hermes_agent.tracing import outgoing_context
from hermes_agent.worker.client import QueueClient
from hermes_agent.worker.store import QueuedRun, runs_table

logger = logging.getLogger("hermes_agent.server")

POLL_S = 0.05
"""How often a stream asks the store for a run's new events."""
END_GRACE_S = 1.0
"""A run the store shows finished whose last event is not there after this long (cancelled
before a worker took it, dead-lettered) ends its streams with one made from its row."""
SETTLED_KEPT = 10_000
SETTLE_SCAN = 10_000
"""At most how many of a user's runs of the day a submit looks at before it asks the quota
(each is read once per instance; those settled already cost nothing more)."""
IN_FLIGHT = ("queued", "running")
"""What counts against ``max_runs_in_flight``: a run waiting for an approval holds no worker."""


ADMISSION_LOCK = 0x68_65_72_6D_65_73_49_46
"""PostgreSQL's advisory lock that admissions to the queue take in turns (``lock_admissions``)."""


def lock_admissions(conn: Connection) -> None:
    """Make this transaction's admission wait for any other in progress, in every process on
    the store, until that one commits: then its count of runs in flight sees the run that one
    queued. SQLite's write lock, taken when the transaction began, does it already."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_advisory_xact_lock(ADMISSION_LOCK)))


def count_in_flight(conn: Connection, owner: str) -> tuple[int, int]:
    """Runs queued or running in the store, of every instance and of ``owner`` (what the
    gate's limits count; a run waiting for an approval holds no worker)."""
    r = runs_table.c
    query = select(
        func.count(), func.coalesce(func.sum(case((r.owner == owner, 1), else_=0)), 0)
    ).where(r.status.in_(IN_FLIGHT))
    row = conn.execute(query).one()
    return int(row[0]), int(row[1])


def check_queue_mode(config: HermesConfig | None, storage: Storage | None = None) -> None:
    """``ConfigError`` unless ``execution: queue`` has what it needs: the config's ``queue:``
    section and a SQL store (where the workers keep the runs): ``storage``, or without it the
    config's ``storage.url``."""
    from hermes_agent.storage.sql import SqlStorage

    source = config.source if config is not None else "the service settings"
    if config is None or config.queue is None:
        raise ConfigError(
            f"{source}: execution: queue sends runs to the workers of the config's queue: "
            "section; add one (queue: {broker: redis://127.0.0.1:6379/0}) or use execution: "
            "in_process"
        )
    if storage is None:
        url = config.storage.url if config.storage is not None else ""
        sql = url.partition(":")[0].partition("+")[0].lower() in ("sqlite", "postgresql")
    else:
        sql = isinstance(storage, SqlStorage)
    if not sql:
        raise ConfigError(
            f"{source}: execution: queue reads the runs back from the workers' SQL store; set "
            "storage.url (postgresql+psycopg://... for workers on several machines)"
        )


def approval_ref(request_id: str, key: str) -> str:
    """The API's id of a queued run's approval: the run's id and the store's key (which holds
    a ``/``), so that the id alone finds the approval from any instance."""
    encoded = base64.urlsafe_b64encode(key.encode()).rstrip(b"=").decode()
    return f"{request_id}~{encoded}"


def parse_approval_ref(ref: str) -> tuple[str, str] | None:
    """``(request_id, key)`` of an ``approval_ref``; ``None`` for anything else."""
    request_id, sep, encoded = ref.partition("~")
    if not sep or not request_id or not encoded:
        return None
    try:
        padded = encoded + "=" * (-len(encoded) % 4)
        key = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return (request_id, key) if key else None


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat()


class QueueService:
    """The service's side of queued runs: submits them, reads them back, follows their events,
    cancels them and answers their approvals. ``local`` is the process it serves in (its gate
    and quotas, its agent, its shutdown: a service shutting down stops following runs; the
    workers go on)."""

    def __init__(
        self,
        config: HermesConfig,
        storage: Storage,
        settings: ServiceSettings,
        local: LocalWork,
    ) -> None:
        check_queue_mode(config, storage)
        assert config.queue is not None
        self.client = QueueClient(config.queue, storage)
        self.store = self.client.store
        self.storage = storage
        self.settings = settings
        self.local = local
        self._settled: OrderedDict[str, None] = OrderedDict()
        """Runs this instance settled already (the store's own guard is the last word)."""

    @property
    def accepting(self) -> bool:
        return self.local.accepting

    def close(self) -> None:
        """Let go of the broker's connections."""
        try:
            self.client.app.close()
        except Exception:  # pragma: no cover - a broker gone away
            logger.exception("closing the queue's broker connections failed")

    # -- submitting ------------------------------------------------------------------------

    async def submit(self, principal: Principal, body: RunRequest) -> QueuedRun:
        """Queue a run for ``principal``: the run layer's gate first (``RunRejected``), then
        the store and the broker. A run the store or the broker does not take is refused with
        503 and does not count (one in the store but not on the queue is marked cancelled: no
        worker would ever see it)."""
        if body.dry_run:
            raise RunRejected(
                422, "dry_run is not available with execution: queue; run it in process"
            )
        if not self.local.accepting or self.local.agent is None:
            raise RunRejected(503, "the service is shutting down; try again on another instance")
        owner, gate = principal.user_id, self.local.gate
        await gate.check_apart(principal, body, self.local.agent, self.storage.max_id_length)
        stored = stored_session_id(owner, body.session_id or uuid.uuid4().hex)
        gate.check_room(*await self._in_flight(owner))  # early, before the quota is asked
        await self.settle_finished(owner)  # turns of runs nobody read back count too
        admission = await gate.take_quota(principal)
        queued = QueuedRequest.of(body, outgoing_context())
        request_id: str | None = None

        def room(conn: Connection) -> None:
            # The check that holds: the count and the run's insert are one transaction,
            # taken in turns by every instance (the early check above races other submits).
            lock_admissions(conn)
            gate.check_room(*count_in_flight(conn, owner))

        try:
            # run_timeout_s means here what it means in process: the run ends timed_out once
            # it has run that long (counted from its first start, across its attempts).
            request_id = await asyncio.to_thread(
                self.store.add,
                stored,
                queued,
                owner=owner,
                run_timeout_s=self.settings.run_timeout_s,
                admit=room,
            )
            await asyncio.to_thread(self.client.send, request_id)
        except RunRejected:
            await gate.give_back(admission)  # no room after all: nothing was queued
            raise
        except Exception as exc:
            where = "store" if request_id is None else "broker"
            logger.exception("a run of %s: the queue's %s did not take it", owner, where)
            reason = f"the queue's {where} did not take the run: {type(exc).__name__}"
            if request_id is not None:  # no worker will ever see it
                await asyncio.to_thread(self.store.cancel, request_id, reason)
            await gate.give_back(admission)
            retry = self.settings.retry_after_s
            raise RunRejected(503, f"{reason}; retry after {retry} s", retry) from None
        found = await asyncio.to_thread(self.store.get, request_id)
        assert found is not None
        return found

    async def _in_flight(self, owner: str) -> tuple[int, int]:
        """Runs queued or running, of every instance and of ``owner`` (what the gate's limits
        count; a run waiting for an approval holds no worker)."""

        def count() -> tuple[int, int]:
            with self.store.storage.transaction(write=False) as conn:
                return count_in_flight(conn, owner)

        return await asyncio.to_thread(count)

    # -- reading ---------------------------------------------------------------------------

    async def owned(self, request_id: str, user: Principal) -> QueuedRun:
        """The run, if the caller owns it (or is an admin); else ``RunNotFound``."""
        found = await asyncio.to_thread(self.store.get, request_id)
        if found is None or (found.owner != user.user_id and not user.admin):
            raise RunNotFound(f"no run {request_id!r}")
        return found

    def client_session(self, run: QueuedRun) -> str:
        """The session id as the run's owner named it."""
        return client_session_id(run.owner, run.session_id) or run.session_id

    def present(self, run: QueuedRun, wire: dict[str, Any]) -> dict[str, Any]:
        """An event as the API shows it: an approval by its API id, a result with the owner's
        session id."""
        event = read_known(wire)
        if isinstance(event, ApprovalRequiredEvent | ApprovalResolvedEvent):
            return {**wire, "approval_id": approval_ref(run.request_id, event.approval_id)}
        if isinstance(event, StoredResultEvent):
            return {**wire, "result": self.result(run, event.result)}
        return wire

    def result(self, run: QueuedRun, result: dict[str, Any] | None) -> dict[str, Any] | None:
        if result is None:
            return None
        return {**result, "session_id": self.client_session(run)}

    async def pending(self, run: QueuedRun) -> list[dict[str, Any]]:
        """The run's approvals waiting for an answer, as the API lists them."""
        if run.status != "waiting_approval":
            return []
        found = await asyncio.to_thread(self.store.pending_approvals, run.request_id)
        return [
            {
                "approval_id": approval_ref(run.request_id, item["approval_id"]),
                "request_id": run.request_id,
                "tool": item["tool"],
                "arguments": item["arguments"],
                "created": _iso(run.updated_ns),
                "expires": None,
            }
            for item in found
        ]

    async def summary(self, run: QueuedRun) -> RunView:
        """A queued run as every door shows it (settling its tokens once it has ended)."""
        await self.settle(run)
        view = run.view(self.client_session(run))
        view.result = self.result(run, run.result)
        view.pending_approvals = await self.pending(run)
        return view

    async def settle(self, run: QueuedRun) -> None:
        """Replace a finished run's reservation with its tokens — every model turn it took,
        however it ended — in its owner's daily quota, once whichever instance sees its
        ending first. A run cut short inside a model turn counts at least its reservation:
        that turn is not in the store (a cancelled run's worker is fenced out)."""
        if not run.finished or run.request_id in self._settled:
            return
        quotas = self.local.gate.quotas
        if not quotas.applies_to(run.owner):
            return
        reserved = quotas.reservation(run.owner)
        if run.status == "completed" and run.result:
            tokens = tokens_used([result_wire(run.result)])
        else:
            stored = await asyncio.to_thread(self.store.events, run.request_id)
            events = [wire for _, wire in stored]
            tokens = tokens_used(events)
            # A worker took it up (``claims``): its first turn's events come with the turn.
            if run.result is None and cut_mid_turn(events, started=run.claims > 0):
                tokens = max(tokens, reserved)
        day = datetime.fromtimestamp(run.created_ns / 1e9, UTC).date().isoformat()
        await self.local.gate.settle(
            run.owner, run.request_id, tokens, once=True, day=day, reserved=reserved
        )
        self._settled[run.request_id] = None
        while len(self._settled) > SETTLED_KEPT:
            self._settled.popitem(last=False)

    async def settle_finished(self, owner: str) -> None:
        """Settle ``owner``'s runs of today that ended without anyone reading them back (a run
        cancelled before its answer still spent its turns), before the gate asks the quota:
        every one of the quota's day, not only the latest."""
        quotas = self.local.gate.quotas
        if not quotas.applies_to(owner):
            return
        day_start = datetime.fromisoformat(quotas.today()).replace(tzinfo=UTC)
        since_ns = int(day_start.timestamp() * 1e9)
        ended = await asyncio.to_thread(self.store.finished_since, owner, since_ns, SETTLE_SCAN)
        for request_id in ended:
            if request_id in self._settled:
                continue
            run = await asyncio.to_thread(self.store.get, request_id)
            if run is not None:
                await self.settle(run)

    # -- following -------------------------------------------------------------------------

    async def follow(
        self, run: QueuedRun, after: int, keepalive: float
    ) -> AsyncGenerator[Item, None]:
        """The run's events after ``after`` as ``(id, wire)``, then live ones, until its
        ``result`` or ``run_stopped``; ``None`` whenever ``keepalive`` seconds pass without one.
        Ends without a last event when the service shuts down (the client follows it again
        elsewhere, with ``Last-Event-ID``)."""
        rid = run.request_id
        quiet_since = time.monotonic()
        finished_since: float | None = None
        while self.local.accepting:
            events = await asyncio.to_thread(self.store.events, rid, after)
            for seq, wire in events:
                after = seq
                shown = self.present(run, wire)
                event = read_known(shown)
                if isinstance(event, StoredResultEvent):
                    latest = await asyncio.to_thread(self.store.get, rid)
                    await self.settle(latest or run)
                yield seq, shown
                if isinstance(event, END_EVENTS):
                    return
            now = time.monotonic()
            if events:
                quiet_since, finished_since = now, None
            else:
                # The worker writes the last event just after the final status: a run whose
                # status is final and whose last event never comes ends from its row.
                latest = await asyncio.to_thread(self.store.get, rid)
                if latest is None:
                    return
                run = latest
                if run.finished:
                    finished_since = finished_since if finished_since is not None else now
                    if now - finished_since >= END_GRACE_S:
                        await self.settle(run)
                        yield None, self.ending(run)
                        return
            if now - quiet_since >= keepalive:
                quiet_since = now
                yield None
            await asyncio.sleep(POLL_S)

    def ending(self, run: QueuedRun) -> dict[str, Any]:
        """The last event of a finished run, made from its row."""
        if run.status == "completed" and run.result is not None:
            shown = self.result(run, run.result)
            assert shown is not None
            return result_wire(shown)
        return RunStoppedEvent(run.status, run.error or run.status).to_dict()

    # -- cancelling and approvals ------------------------------------------------------------

    async def cancel(self, request_id: str, principal: Principal) -> tuple[bool, RunView]:
        """Cancel a run that has not finished (its worker stops at its next heartbeat)."""
        run = await self.owned(request_id, principal)
        reason = "cancelled by the client"
        cancelled = await asyncio.to_thread(self.store.cancel, run.request_id, reason)
        latest = await asyncio.to_thread(self.store.get, request_id)
        view = await self.summary(latest or run)
        if cancelled:
            view.still_running = await asyncio.to_thread(self._started_calls, run.request_id)
        return cancelled, view

    def _started_calls(self, request_id: str) -> list[dict[str, Any]]:
        """The calls the run's journal shows started and not finished (``call/<step>/<index>``
        entries in state ``started``)."""
        running = []
        for key, (state, payload) in self.store.journal_entries(request_id).items():
            kind, _, place = key.partition("/")
            if kind != "call" or state != "started":
                continue
            step = place.partition("/")[0]
            name = payload.get("tool") if isinstance(payload, dict) else None
            running.append(
                {
                    "name": name,
                    "call_id": f"{request_id}/{place}",
                    "step": int(step) if step.isdigit() else None,
                }
            )
        return running

    async def answer(
        self, approval_id: str, principal: Principal, approved: bool, reason: str
    ) -> None:
        """Answer a queued run's approval (once; only the run's owner); the run goes back to
        the queue and resumes. ``RunNotFound`` for an unknown approval or someone else's,
        ``ApprovalConflict`` when it was answered already."""
        ref = approval_id
        parsed = parse_approval_ref(ref)
        if parsed is None:
            raise RunNotFound(f"no approval {ref!r}")
        request_id, key = parsed
        found = await asyncio.to_thread(self.store.get, request_id)
        if found is None or found.owner != principal.user_id:
            raise RunNotFound(f"no approval {ref!r}")
        state = await asyncio.to_thread(self.store.approval, request_id, key)
        if state is None:
            raise RunNotFound(f"no approval {ref!r}")
        gate = self.local.gate
        if state[0] == "pending":
            # The answer puts the run back on the queue: it must have room, like a new run
            # (a parked run holds no worker, so parking many must not run many at once).
            gate.check_room(*await self._in_flight(found.owner))

        def room(conn: Connection) -> None:  # the check that holds, as in submit
            lock_admissions(conn)
            gate.check_room(*count_in_flight(conn, found.owner))

        decided = state[0] == "pending" and await asyncio.to_thread(
            self.client.decide, request_id, key, approved, reason, room
        )
        if not decided:
            raise ApprovalConflict(f"approval {ref!r} was answered already")

    # -- the rest of runs.backend.RunBackend -------------------------------------------------

    answers_plain_posts = False

    async def start(
        self, principal: Principal, request: RunRequest, *, listening: bool = True
    ) -> RunView:
        return await self.summary(await self.submit(principal, request))

    async def view(self, request_id: str, principal: Principal) -> RunView:
        return await self.summary(await self.owned(request_id, principal))

    def held_events(self, request_id: str, principal: Principal) -> list[dict[str, Any]] | None:
        return None  # a queued run lives in a worker: its events are read from the store

    async def events(
        self,
        request_id: str,
        principal: Principal,
        after: int,
        keepalive: float,
        *,
        started: bool = False,
    ) -> AsyncGenerator[Item, None]:
        return self.follow(await self.owned(request_id, principal), after, keepalive)

    async def wait(
        self, request_id: str, principal: Principal, *, started: bool = False
    ) -> RunView:
        """Poll the store until the run has ended or waits for an approval."""
        run = await self.owned(request_id, principal)
        while not run.finished and run.status != "waiting_approval" and self.local.accepting:
            await asyncio.sleep(POLL_S)
            latest = await asyncio.to_thread(self.store.get, request_id)
            run = latest if latest is not None else run
        return await self.summary(run)

    async def runs(
        self, principal: Principal, session_id: str | None, status: str | None, limit: int
    ) -> list[dict[str, Any]]:
        return await self.runs_of(principal, session_id, status, limit)

    async def approvals(self, principal: Principal) -> list[dict[str, Any]]:
        return await self.pending_of(principal)

    def admitted(
        self, principal: Principal, request: RunRequest, what: str
    ) -> contextlib.AbstractAsyncContextManager[Tally]:
        local, owner = self.local, principal.user_id
        if local.agent is None:
            raise RunRejected(503, "the service is shutting down; try again on another instance")

        async def counts() -> tuple[int, int]:
            # The workers' runs of every instance, and this process's own local work.
            total, mine = await self._in_flight(owner)
            return total + local.in_flight(), mine + local.in_flight(owner)

        return admitted_here(
            local.gate, principal, request, local.agent, counts,
            lambda: local.holding(owner, what),
        )  # fmt: skip

    async def pending_of(self, user: Principal) -> list[dict[str, Any]]:
        """The user's approvals waiting for an answer, oldest first, over all their runs."""
        waiting = await asyncio.to_thread(
            self.store.runs, status="waiting_approval", owner=user.user_id, limit=500
        )
        found: list[dict[str, Any]] = []
        for run in waiting:
            session = self.client_session(run)
            found.extend({**p, "session_id": session} for p in await self.pending(run))
        found.sort(key=lambda p: str(p["created"]))
        return found

    async def runs_of(
        self, user: Principal, session_id: str | None, status: str | None, limit: int
    ) -> list[dict[str, Any]]:
        """The user's queued runs, newest first (``GET /v1/runs``)."""
        scan = limit * 4 if session_id is not None else limit
        rows = await asyncio.to_thread(
            self.store.runs, status=status, owner=user.user_id, limit=scan
        )
        listed = [
            {
                "request_id": run.request_id,
                "session_id": self.client_session(run),
                "status": run.status,
                "created": run.created_ns / 1e9,
                "source": "queue",
            }
            for run in rows
        ]
        return [r for r in listed if session_id in (None, r["session_id"])][:limit]
