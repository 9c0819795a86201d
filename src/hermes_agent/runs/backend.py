"""The one seam between the front doors and the engines: ``RunBackend``.

Two implementations offer the same operations with the same status vocabulary
(``runs.status``) and the same run shape (``RunView``): in process (``server.runs``: each run an
asyncio task of this process) and queued (``server.queued``: runs on the Celery workers, read
back from the store they write). A front door calls these and never asks which engine it has::

    view = await backend.start(principal, request)          # the gate, then the engine
    async for item in await backend.events(view.request_id, principal, after=0, keepalive=15):
        ...                                                 # (id, wire), or None: keep-alive
    view = await backend.wait(view.request_id, principal)    # ended, or waiting for approval
    await backend.cancel(view.request_id, principal)
    await backend.answer(approval_id, principal, approved=True, reason="ok")
    async with backend.admitted(principal, request, "replay") as tally:
        ...                                                 # work done here, gated the same

Someone else's run or approval is ``RunNotFound`` (a 404 at every door, never a 403: the id
itself is not confirmed); an approval answered already is ``ApprovalConflict`` (409).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from hermes_agent.errors import HermesAgentError
from hermes_agent.runs.principal import Principal
from hermes_agent.runs.request import RunRequest
from hermes_agent.runs.status import FINAL_STATUSES

if TYPE_CHECKING:
    from hermes_agent.agent import Agent
    from hermes_agent.runs.gate import Gate, Tally

Item = tuple[int | None, dict[str, Any]] | None
"""What following a run yields: an event as ``(id, wire)`` (``id`` ``None`` for an ending made
from the run's row, which the log does not hold), or ``None`` for a keep-alive."""


class RunNotFound(HermesAgentError, LookupError):
    """No such run or approval that the caller may see (404)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ApprovalConflict(HermesAgentError):
    """The approval was answered already (409)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(slots=True)
class RunView:
    """A run as every door shows it (``GET /v1/runs/{id}``): one shape whichever engine ran it
    and wherever it is read from. Fields an engine does not know are ``None``.

    ``source`` says where the answer came from: ``memory`` (this process runs it or ran it
    lately), ``queue`` (the workers' store) or ``store`` (only the audit trail knows it)."""

    request_id: str
    session_id: str
    status: str
    """One of ``runs.status.RunStatus``, or ``incomplete`` for a trail that was cut short."""
    source: Literal["memory", "queue", "store"]
    created: float | None = None
    finished: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    pending_approvals: list[dict[str, Any]] = field(default_factory=list)
    events: int | None = None
    attempts: int | None = None
    redeliveries: int | None = None
    worker: str | None = None
    status_code: int | None = None
    output: str | None = None
    records: int | None = None
    still_running: list[dict[str, Any]] = field(default_factory=list)
    """Tool calls the run stopped waiting for that are still running (``name``, ``call_id``,
    ``step``): a cancel cannot stop a sync in-process tool (see ``pipeline.watch``)."""

    @property
    def done(self) -> bool:
        """The run has ended (or, read from a cut trail, will never end)."""
        return self.status in FINAL_STATUSES or self.status == "incomplete"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def listed(self) -> dict[str, Any]:
        """The run as ``GET /v1/runs`` lists it (no result, no approvals)."""
        return {
            "request_id": self.request_id,
            "session_id": self.session_id,
            "status": self.status,
            "created": self.created,
            "source": self.source,
        }


class RunBackend(Protocol):
    """Start, read, follow, wait for, cancel and answer runs (see the module docstring)."""

    answers_plain_posts: bool
    """Whether a plain ``POST /v1/runs`` waits for the answer (in process) or is answered
    ``202`` as soon as the run is accepted (queued: any instance can be asked for it later)."""

    @property
    def accepting(self) -> bool:
        """Whether new runs are taken here (``False`` once the service is shutting down)."""
        ...

    async def start(
        self, principal: Principal, request: RunRequest, *, listening: bool = True
    ) -> RunView:
        """Pass the gate and start the run. With ``listening`` the caller follows it from the
        start (``events(started=True)`` or ``wait(started=True)``): an approval may wait for
        it. Raises ``RunRejected`` (the gate) or ``HermesAgentError`` (refused before it
        starts)."""
        ...

    async def view(self, request_id: str, principal: Principal) -> RunView:
        """The run as it is now (``RunNotFound``)."""
        ...

    async def events(
        self,
        request_id: str,
        principal: Principal,
        after: int,
        keepalive: float,
        *,
        started: bool = False,
    ) -> AsyncGenerator[Item, None]:
        """The run's events after ``after``, then live ones, until its last; ``None`` each
        ``keepalive`` seconds without one. Checked before anything streams (``RunNotFound``);
        ``started``: the caller is the one ``start(listening=True)`` counted."""
        ...

    async def wait(
        self, request_id: str, principal: Principal, *, started: bool = False
    ) -> RunView:
        """Wait until the run has ended or waits for an approval."""
        ...

    async def cancel(self, request_id: str, principal: Principal) -> tuple[bool, RunView]:
        """Cancel a run not yet ended; whether it was cancelled now, and the run after."""
        ...

    async def answer(
        self, approval_id: str, principal: Principal, approved: bool, reason: str
    ) -> None:
        """Answer one pending approval of the caller's (``RunNotFound``, ``ApprovalConflict``)."""
        ...

    async def runs(
        self, principal: Principal, session_id: str | None, status: str | None, limit: int
    ) -> list[dict[str, Any]]:
        """The caller's runs, newest first, as ``RunView.listed`` shows them."""
        ...

    async def approvals(self, principal: Principal) -> list[dict[str, Any]]:
        """The caller's approvals waiting for an answer, oldest first."""
        ...

    def held_events(self, request_id: str, principal: Principal) -> list[dict[str, Any]] | None:
        """The events so far of a run this process holds in memory (its steps and its
        approvals as they were asked and answered, before the trail has them all); ``None``
        for a run it does not hold (a queued run, a run read from the store)."""
        ...

    def admitted(
        self, principal: Principal, request: RunRequest, what: str
    ) -> AbstractAsyncContextManager[Tally]:
        """Work of the caller's that runs in this process and is not a run of the engine (a
        replay, an MCP server's direct tool call; ``what`` names it): admitted by the same gate
        as a run (``RunRejected``), counted among the runs in flight while it lasts, and its
        tokens (the yielded ``Tally``) settled on the caller's day however it ends."""
        ...


class LocalWork(Protocol):
    """What an engine shares with the process serving it: the gate (the service's limits and
    daily quotas), the agent the gate checks requests against, whether the process still
    takes runs, and the work it runs itself (its in-process runs, replays), which the limits
    count beside the engine's own runs. The in-process engine's ``RunManager`` is one; the
    queued engine takes it instead of an engine of its own kind."""

    @property
    def agent(self) -> Agent | None: ...

    @property
    def accepting(self) -> bool: ...

    @property
    def gate(self) -> Gate: ...

    def in_flight(self, owner: str | None = None) -> int:
        """Work in flight here, of one owner or of all."""
        ...

    def holding(self, owner: str, what: str) -> AbstractContextManager[None]:
        """Count ``owner``'s work ``what`` as one run in flight while it lasts."""
        ...
