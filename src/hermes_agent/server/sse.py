"""Server-Sent Events for a run: ``id:`` + ``event: <kind>`` + ``data: <json>``, a keep-alive
comment while nothing happens, and a client that stops reading dropped after a send timeout
(the run goes on)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from hermes_agent.server.runs import Run

logger = logging.getLogger("hermes_agent.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def to_json(data: Any) -> str:
    """JSON for the wire; a value JSON cannot hold (a tool's odd result) becomes its str."""
    return json.dumps(data, ensure_ascii=False, default=str)


def sse_frame(event_id: int, wire: dict[str, Any]) -> str:
    """One event as an SSE frame."""
    return f"id: {event_id}\nevent: {wire['kind']}\ndata: {to_json(wire)}\n\n"


KEEPALIVE_COMMENT = ": keep-alive\n\n"


async def follow_run(
    run: Run, after: int, keepalive: float
) -> AsyncGenerator[tuple[int, dict[str, Any]] | None, None]:
    """A run's events after event ``after`` as ``(id, wire)``, and ``None`` whenever
    ``keepalive`` seconds pass without one (time for a keep-alive). The caller has attached to
    the run; this detaches when it ends (the run finished, or it was closed: close it with
    ``contextlib.aclosing`` so that the detach is not left to the garbage collector)."""
    events = run.follow(after)
    upcoming: asyncio.Future[tuple[int, dict[str, Any]]] | None = None
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
        run.detach()


async def run_events(run: Run, after: int, keepalive: float) -> AsyncIterator[str]:
    """The frames of a run after event ``after``; the caller has attached to the run, and this
    detaches when the stream ends (finished, or the client gone)."""
    async with aclosing(follow_run(run, after, keepalive)) as items:
        async for item in items:
            yield KEEPALIVE_COMMENT if item is None else sse_frame(*item)


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` whose every send must finish within ``send_timeout``."""

    def __init__(self, content: AsyncIterator[str], send_timeout: float) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self.send_timeout = send_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def timed_send(message: Message) -> None:
            with anyio.fail_after(self.send_timeout):
                await send(message)

        try:
            await super().__call__(scope, receive, timed_send)
        except* TimeoutError:
            logger.info("dropped an event-stream client that stopped reading")
