"""The in-process engine: runs are asyncio tasks of this process (``RunManager``), and a run
this process no longer holds is read from its audit trail."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator
from datetime import datetime
from typing import Any

from hermes_agent.agent import Agent
from hermes_agent.audit.records import Role
from hermes_agent.runs.approvals import ApprovalAnswered, ApprovalBook
from hermes_agent.runs.backend import ApprovalConflict, Item, RunNotFound, RunView
from hermes_agent.runs.gate import RunRejected, Tally, admitted_here
from hermes_agent.runs.local import RunManager
from hermes_agent.runs.metrics import ServiceMetrics
from hermes_agent.runs.principal import Principal, client_session_id
from hermes_agent.runs.quotas import Quotas
from hermes_agent.runs.request import RunRequest
from hermes_agent.runs.run_log import Run, follow_run
from hermes_agent.runs.settings import ServiceSettings
from hermes_agent.stages import StageName
from hermes_agent.storage.base import Storage

_STOPPED_STATUS = {409: "cancelled", 504: "timed_out", 503: "interrupted"}


def stored_status(status: str, status_code: int) -> str:
    """A run's status from the store's summary of its trail: the output record's
    ``ok``/``error``, a ``stopped`` record (its code says why), or ``incomplete`` (the trail was
    cut short: the process died mid-run)."""
    if status == "ok":
        return "completed"
    if status == "stopped":
        return _STOPPED_STATUS.get(status_code, "failed")
    return "incomplete" if status == "incomplete" else "failed"


class InProcessBackend:
    """``RunBackend`` over a ``RunManager``: runs are tasks of this process; a run this process
    no longer holds (finished long ago, or run by another process on the same store) is read
    from its audit trail."""

    answers_plain_posts = True

    def __init__(self, manager: RunManager, storage: Storage | None) -> None:
        self.manager = manager
        self.storage = storage

    @property
    def accepting(self) -> bool:
        return self.manager.accepting

    def _held(self, request_id: str, principal: Principal) -> Run:
        run = self.manager.get(request_id, principal.user_id, admin=principal.admin)
        if run is None:
            raise RunNotFound(f"no run {request_id!r} in memory; GET /v1/runs/{request_id}")
        return run

    def _view(self, run: Run) -> RunView:
        return RunView(
            request_id=run.id,
            session_id=run.session_id,
            status=run.status,
            source="memory",
            created=run.created,
            finished=run.finished,
            result=run.result,
            error=run.error,
            pending_approvals=self.manager.pending(run),
            events=len(run.events),
            still_running=self.manager.still_running(run),
        )

    async def start(
        self, principal: Principal, request: RunRequest, *, listening: bool = True
    ) -> RunView:
        return self._view(await self.manager.start(principal, request, listening=listening))

    async def view(self, request_id: str, principal: Principal) -> RunView:
        run = self.manager.get(request_id, principal.user_id, admin=principal.admin)
        if run is not None:
            return self._view(run)
        found = await asyncio.to_thread(self._stored, request_id, principal)
        if found is None:
            raise RunNotFound(f"no run {request_id!r}")
        return found

    def _stored(self, request_id: str, principal: Principal) -> RunView | None:
        """A run's status from its audit records, if the caller owns it."""
        if self.storage is None:
            return None
        records = self.storage.records(request_id)
        if not records:
            return None
        session = client_session_id(principal.user_id, records[0].session_id)
        if session is None and not principal.admin:
            return None
        # A late result of an abandoned call comes after the ending: the ending is the last
        # record of the run's own.
        own = [record for record in records if record.role != Role.LATE_RESULT]
        last = own[-1] if own else records[-1]
        output = last.stage == StageName.OUTPUT_RENDERER
        stopped = last.role == Role.STOPPED
        status = stored_status(
            last.status if output else "stopped" if stopped else "incomplete", last.status_code
        )
        return RunView(
            request_id=request_id,
            session_id=session if session is not None else records[0].session_id,
            status=status,
            source="store",
            created=records[0].timestamp_ns / 1e9,
            finished=last.timestamp_ns / 1e9 if status != "incomplete" else None,
            status_code=last.status_code,
            output=last.content if output else None,
            records=len(records),
        )

    async def events(
        self,
        request_id: str,
        principal: Principal,
        after: int,
        keepalive: float,
        *,
        started: bool = False,
    ) -> AsyncGenerator[Item, None]:
        run = self._held(request_id, principal)
        if not started:
            run.attach()
        return follow_run(run, after, keepalive)

    async def wait(
        self, request_id: str, principal: Principal, *, started: bool = False
    ) -> RunView:
        run = self._held(request_id, principal)
        try:
            while not run.done and not self.manager.pending(run):
                await run.milestone()
        finally:
            if started:
                run.detach()
        return self._view(run)

    async def cancel(self, request_id: str, principal: Principal) -> tuple[bool, RunView]:
        run = self._held(request_id, principal)
        cancelled = self.manager.cancel(run)
        if cancelled and run.task is not None:
            await asyncio.wait({run.task}, timeout=10)
        view = self._view(run)
        # A cancel that lands while the run saves its turn comes too late: the run ends as it
        # finished (``memory.session.off_the_loop``), and the answer says it was not cancelled.
        return cancelled and (not run.done or view.status == "cancelled"), view

    async def answer(
        self, approval_id: str, principal: Principal, approved: bool, reason: str
    ) -> None:
        approvals = self.manager.approvals
        pending = approvals.get(approval_id, principal.user_id)
        if pending is None:
            raise RunNotFound(f"no approval {approval_id!r}")
        try:
            approvals.answer(pending, approved, reason)
        except ApprovalAnswered:
            raise ApprovalConflict(f"approval {approval_id!r} was answered already") from None

    async def runs(
        self, principal: Principal, session_id: str | None, status: str | None, limit: int
    ) -> list[dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for run in reversed(self.manager.runs.values()):
            if run.owner == principal.user_id and session_id in (None, run.session_id):
                found[run.id] = self._view(run).listed()
        for row in await asyncio.to_thread(self._stored_list, principal, session_id, limit):
            found.setdefault(row["request_id"], row)
        return [r for r in found.values() if status in (None, r["status"])][:limit]

    def _stored_list(
        self, principal: Principal, session_id: str | None, limit: int
    ) -> list[dict[str, Any]]:
        if self.storage is None:
            return []
        rows = []
        for row in self.storage.requests(limit=limit * 4):
            session = client_session_id(principal.user_id, row["session_id"])
            if session is None or session_id not in (None, session):
                continue
            rows.append(
                RunView(
                    request_id=row["request_id"],
                    session_id=session,
                    status=stored_status(row["status"], row["status_code"]),
                    source="store",
                    created=datetime.fromisoformat(row["started"]).timestamp(),
                ).listed()
            )
        return rows

    def admitted(
        self, principal: Principal, request: RunRequest, what: str
    ) -> contextlib.AbstractAsyncContextManager[Tally]:
        manager, owner = self.manager, principal.user_id
        if manager.agent is None:
            raise RunRejected(503, "the service is shutting down; try again on another instance")

        async def counts() -> tuple[int, int]:
            return manager.in_flight(), manager.in_flight(owner)

        return admitted_here(
            manager.gate, principal, request, manager.agent, counts,
            lambda: manager.holding(owner, what),
        )  # fmt: skip

    def held_events(self, request_id: str, principal: Principal) -> list[dict[str, Any]] | None:
        run = self.manager.get(request_id, principal.user_id, admin=principal.admin)
        return None if run is None else [wire for _, wire in run.events]

    async def approvals(self, principal: Principal) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for run in self.manager.runs.values():
            if run.owner == principal.user_id and not run.done:
                found.extend({**p, "session_id": run.session_id} for p in self.manager.pending(run))
        found.sort(key=lambda p: str(p["created"]))
        return found


# -- an in-process engine for an agent ------------------------------------------------------


@dataclasses.dataclass(slots=True)
class InProcessService:
    """What runs an agent's runs in this process: the manager, the one fork of the agent that
    serves every run (its approver asks the run's owner), and the backend over both."""

    manager: RunManager
    agent: Agent
    backend: InProcessBackend

    def close(self) -> None:
        """Close the serving fork (its tool pools; the audit trail is flushed)."""
        self.agent.close()


def serve_in_process(
    agent: Agent,
    settings: ServiceSettings,
    *,
    metrics: ServiceMetrics | None = None,
    quotas: Quotas | None = None,
) -> InProcessService:
    """The in-process engine for ``agent`` under ``settings``: one fork of it serves every run
    (so tool pools, rate limits and caches are shared); without a store of its own, sessions
    and trails are kept in memory. ``quotas`` defaults to the settings' quotas counted in
    memory."""
    manager = RunManager(settings, metrics or ServiceMetrics(), ApprovalBook())
    if quotas is not None:
        manager.quotas = quotas
    if agent.storage is None:
        served = agent.fork(approver=manager.approver, storage="memory://")
    else:
        served = agent.fork(approver=manager.approver)
    manager.agent = served
    return InProcessService(manager, served, InProcessBackend(manager, served.storage))
