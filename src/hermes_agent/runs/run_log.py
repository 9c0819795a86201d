"""One in-process run as its clients see it: its owner, its status, its log of events (ids
1, 2, ...) and its task; and ``follow_run``, how a client reads the log as it grows.

A run wakes two kinds of waiter: whoever follows its events (a stream, a socket) at every
event, and a plain request, which waits for its answer, only at its milestones (an approval
asked, its ending).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from hermes_agent.errors import HermesAgentError
from hermes_agent.runs.settings import FINAL_STATUSES, RunStatus


class Run:
    """One run: its owner, its status, its event log, and its task."""

    def __init__(self, owner: str, session_id: str, *, new_session: bool = False) -> None:
        self.id = ""
        self.owner = owner
        self.session_id = session_id
        self.new_session = new_session
        """The session id was made up for this run: the session holds nothing to read."""
        self.status: RunStatus = "running"
        self.created = time.time()
        self.finished: float | None = None
        self.events: list[tuple[int, dict[str, Any]]] = []
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        self.listeners = 0
        """Clients following the run now (streams, sockets, a plain POST waiting)."""
        self.followers = 0
        """Clients reading the run's events now (streams, sockets): while there are any, its
        model turns are streamed, so that they see the reply piece by piece."""
        self.cancel_reason: str | None = None
        self.start_error: HermesAgentError | None = None
        self.started = False
        """The agent took the run up (past its own refusals: its input stage began)."""
        self.warnings: list[str] = []
        """What the run's result must say beyond the agent's (a record the store refused)."""
        self.dropped_before = 0
        """Records the store's writer had set aside when the run began."""
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._milestone = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.status in FINAL_STATUSES

    def add(self, wire: dict[str, Any], *, milestone: bool = False) -> int:
        """Append one event (its wire dict); returns its id. ``milestone``: the event is one
        that a plain request waits for (an approval asked, the ending; see ``milestone``): an
        event that changes what ``InProcessBackend.wait`` checks must say so, or that waiter
        sleeps on (``poke``, which events do not call, wakes everyone by default)."""
        event_id = len(self.events) + 1
        self.events.append((event_id, wire))
        self.poke(milestone=milestone)
        return event_id

    def poke(self, *, milestone: bool = True) -> None:
        """Wake everyone waiting for a change; with ``milestone`` also whoever waits only for
        the run's milestones."""
        self._wake.set()
        self._wake = asyncio.Event()
        if milestone:
            self._milestone.set()
            self._milestone = asyncio.Event()

    def attach(self) -> None:
        """A client starts following the run."""
        self.listeners += 1

    def detach(self) -> None:
        """A client stopped following the run."""
        self.listeners = max(0, self.listeners - 1)

    async def changed(self) -> None:
        """Wait for the next event or status change."""
        await self._wake.wait()

    async def milestone(self) -> None:
        """Wait for the run's next milestone: an approval asked, or its ending. What a plain
        request waits on: woken at every event, it would resume its whole request's
        coroutines (the route, the middleware) a dozen times a run for nothing."""
        await self._milestone.wait()

    async def follow(self, after: int = 0) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """Every event after id ``after``, then live ones, until the run is over."""
        index = max(0, after)
        while True:
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self.done:
                return
            await self.changed()


async def follow_run(
    run: Run, after: int, keepalive: float
) -> AsyncGenerator[tuple[int, dict[str, Any]] | None, None]:
    """A run's events after event ``after`` as ``(id, wire)``, and ``None`` whenever
    ``keepalive`` seconds pass without one (time for a keep-alive). The caller has attached to
    the run; this detaches when it ends (the run finished, or it was closed: close it with
    ``contextlib.aclosing`` so that the detach is not left to the garbage collector)."""
    events = run.follow(after)
    upcoming: asyncio.Future[tuple[int, dict[str, Any]]] | None = None
    # Counted from its first read: a generator never read (a refused stream) never ran its
    # ``finally`` and must not have counted.
    run.followers += 1
    try:
        while True:
            if upcoming is None:
                upcoming = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({upcoming}, timeout=keepalive)
            if not done:
                yield None
                continue
            try:
                item = upcoming.result()
            except StopAsyncIteration:
                return
            upcoming = None
            yield item
    finally:
        if upcoming is not None:
            upcoming.cancel()
        run.followers -= 1
        run.detach()
