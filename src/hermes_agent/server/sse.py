"""Server-Sent Events for a run: ``id:`` + ``event: <kind>`` + ``data: <json>``, a keep-alive
comment while nothing happens, and a client that stops reading dropped after a send timeout
(the run goes on).

An open stream outlives the request that checked its key, so the key (or the stream token,
and the key behind it) is checked again before every frame and keep-alive (``LiveCheck``, at
most one store lookup per ``key_check_s``): a revoked key's stream ends at its next keep-alive
at the latest. A user holds at most ``max_streams_per_user`` streams and WebSockets at once
(``OpenStreams``)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import anyio
from starlette.datastructures import Headers, QueryParams
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from hermes_agent.runs.backend import Item
from hermes_agent.server.auth import Credential, LiveCheck

logger = logging.getLogger("hermes_agent.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def to_json(data: Any) -> str:
    """JSON for the wire; a value JSON cannot hold (a tool's odd result) becomes its str."""
    return json.dumps(data, ensure_ascii=False, default=str)


def sse_frame(event_id: int, wire: dict[str, Any]) -> str:
    """One event as an SSE frame."""
    return f"id: {event_id}\nevent: {wire['kind']}\ndata: {to_json(wire)}\n\n"


KEEPALIVE_COMMENT = ": keep-alive\n\n"
REVOKED_COMMENT = ": the key of this stream was revoked\n\n"


class OpenStreams:
    """How many event streams and WebSockets each user holds open, within a cap."""

    def __init__(self, per_user: int) -> None:
        self.per_user = per_user
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def enter(self, user_id: str, *, refuse: bool = True) -> bool:
        """Count one more for ``user_id``; ``False`` (and not counted) when that would pass
        the cap and ``refuse`` is set."""
        with self._lock:
            held = self._open.get(user_id, 0)
            if refuse and held >= self.per_user:
                return False
            self._open[user_id] = held + 1
            return True

    def leave(self, user_id: str) -> None:
        with self._lock:
            held = self._open.get(user_id, 0) - 1
            if held > 0:
                self._open[user_id] = held
            else:
                self._open.pop(user_id, None)

    def held(self, user_id: str) -> int:
        return self._open.get(user_id, 0)

    def refusal(self) -> str:
        return (
            f"too many open event streams and WebSockets for this user (max_streams_per_user: "
            f"{self.per_user}); close one first"
        )


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


async def while_standing(
    content: AsyncIterator[str], live: LiveCheck, credential: Credential
) -> AsyncIterator[str]:
    """``content`` for as long as ``credential`` stands, checked before each frame (a
    keep-alive included); then one comment saying why, and the end (``content`` closed)."""
    try:
        async for chunk in content:
            if not await live.stands(credential):
                yield REVOKED_COMMENT
                return
            yield chunk
    finally:
        closing = getattr(content, "aclose", None)
        if closing is not None:
            await closing()


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` whose every send must finish within ``send_timeout``, that
    ends when the caller's key is revoked, and that counts towards the caller's open
    streams."""

    def __init__(self, content: AsyncIterator[str], send_timeout: float) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self.send_timeout = send_timeout
        self.frames = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope["app"].state
        user = str(scope.get("state", {}).get("user_id") or "")
        streams: OpenStreams = state.streams
        # The stream of a run this request just started is never refused: the run is on
        # its way, and the per-user limit on runs in flight already bounds such streams.
        if not streams.enter(user, refuse=scope.get("method") != "POST"):
            refused = JSONResponse({"detail": streams.refusal()}, 429, {"Retry-After": "1"})
            await refused(scope, receive, send)
            return
        if state.settings.auth == "keys":
            credential = Credential.of(
                Headers(scope=scope).get("authorization"), dict(QueryParams(scope["query_string"]))
            )
            self.body_iterator = while_standing(self.frames, state.live, credential)

        async def timed_send(message: Message) -> None:
            with anyio.fail_after(self.send_timeout):
                await send(message)

        try:
            await super().__call__(scope, receive, timed_send)
        except* TimeoutError:
            logger.info("dropped an event-stream client that stopped reading")
        finally:
            streams.leave(user)
