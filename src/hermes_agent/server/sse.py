"""Server-Sent Events for a run: ``id:`` + ``event: <kind>`` + ``data: <json>``, a keep-alive
comment while nothing happens, and a client that stops reading dropped after a send timeout
(the run goes on)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from hermes_agent.runs.backend import Item

logger = logging.getLogger("hermes_agent.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def to_json(data: Any) -> str:
    """JSON for the wire; a value JSON cannot hold (a tool's odd result) becomes its str."""
    return json.dumps(data, ensure_ascii=False, default=str)


def sse_frame(event_id: int, wire: dict[str, Any]) -> str:
    """One event as an SSE frame."""
    return f"id: {event_id}\nevent: {wire['kind']}\ndata: {to_json(wire)}\n\n"


KEEPALIVE_COMMENT = ": keep-alive\n\n"


async def frames(items: AsyncGenerator[Item, None]) -> AsyncIterator[str]:
    """A run's events (``RunBackend.events``) as SSE frames: ``None`` is a keep-alive, and an
    ending made from the run's row (``id`` ``None``, not in the log) has no ``id:``. Closes
    ``items`` when the stream ends (finished, or the client gone)."""
    async with aclosing(items) as following:
        async for item in following:
            if item is None:
                yield KEEPALIVE_COMMENT
            elif item[0] is None:
                yield f"event: {item[1]['kind']}\ndata: {to_json(item[1])}\n\n"
            else:
                yield sse_frame(item[0], item[1])


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
