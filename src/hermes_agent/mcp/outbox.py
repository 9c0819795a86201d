"""What a ``tools/call`` sends its caller before its result: progress reports and log messages,
in the order the tool made them.

A tool's log lines are the records it logs with Python's ``logging`` while the call runs (from
an ``async`` tool, or a sync one on its thread), at the levels its loggers let through. The
runtime's own records (``hermes_agent.*``, the SDK's ``mcp.*``) stay in the server's log. Each
goes to the caller as ``notifications/message`` (``logger`` is the record's logger name,
``data`` its message): on a session of 2025-11-25 or before at or above the level the caller set
with ``logging/setLevel`` (``info`` until it sets one); at 2026-07-28 only when the request's
``_meta`` asked for a level (``io.modelcontextprotocol/logLevel``), at or above it (the SDK
drops the rest).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import suppress
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext
    from mcp.types import LoggingLevel

LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""MCP's log levels, least severe first."""
DEFAULT_LEVEL = "info"
_INTERNAL = ("hermes_agent", "mcp")

Sink = Callable[[logging.LogRecord], None]
_sink: ContextVar[Sink | None] = ContextVar("hermes_agent_mcp_log_sink", default=None)


def mcp_level(levelno: int) -> str:
    """A ``logging`` level as MCP's (the nearest at or below it)."""
    if levelno >= logging.CRITICAL:
        return "critical"
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warning"
    if levelno >= logging.INFO:
        return "info"
    return "debug"


class _CallerLog(logging.Handler):
    """On the root logger: hands each record logged in a call's context to that call's sink."""

    def emit(self, record: logging.LogRecord) -> None:
        if _unhandled(record):  # what Python prints when no handler takes a record: still
            last = logging.lastResort
            if last is not None and record.levelno >= last.level:
                last.handle(record)
        sink = _sink.get()
        if sink is None or record.name.split(".")[0] in _INTERNAL:
            return
        with suppress(Exception):
            sink(record)


def _unhandled(record: logging.LogRecord) -> bool:
    """Whether no handler but this one takes ``record`` (Python's last resort would then)."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        if any(not isinstance(handler, _CallerLog) for handler in logger.handlers):
            return False
        if not logger.propagate:
            break
        logger = logger.parent
    return True


_handler = _CallerLog()


def install() -> None:
    """Put the handler on the root logger (once per process)."""
    root = logging.getLogger()
    if _handler not in root.handlers:
        root.addHandler(_handler)


class SessionLevels:
    """The level each session's caller set with ``logging/setLevel`` (2025-11-25 and before),
    keyed by its ``Mcp-Session-Id`` (one key for a stdio or in-memory connection). Bounded:
    the oldest are forgotten, and fall back to ``DEFAULT_LEVEL``."""

    def __init__(self, max_sessions: int = 10_000) -> None:
        self._levels: OrderedDict[str, str] = OrderedDict()
        self._max = max_sessions

    @staticmethod
    def key(ctx: ServerRequestContext[Any]) -> str:
        headers = getattr(ctx.request, "headers", None)
        return str(headers.get("mcp-session-id") or "") if headers is not None else ""

    def set(self, ctx: ServerRequestContext[Any], level: str) -> None:
        key = self.key(ctx)
        self._levels[key] = level
        self._levels.move_to_end(key)
        while len(self._levels) > self._max:
            self._levels.popitem(last=False)

    def get(self, ctx: ServerRequestContext[Any] | None) -> str:
        return DEFAULT_LEVEL if ctx is None else self._levels.get(self.key(ctx), DEFAULT_LEVEL)


class Outbox:
    """The notifications of one ``tools/call``, sent by one task in the order they were made,
    from the loop or from a tool's thread. ``ctx`` is the request they go out on."""

    def __init__(self, ctx: ServerRequestContext[Any] | None, log_level: str | None) -> None:
        self.ctx = ctx
        least = LEVELS.index(log_level) if log_level in LEVELS else 0
        self._levels = frozenset(LEVELS[least:])
        if ctx is not None:  # at 2026-07-28 only what the request's _meta asked for
            from mcp.server.connection import allowed_log_levels

            self._levels &= allowed_log_levels(ctx.protocol_version, ctx.meta)
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Callable[[], Awaitable[None]] | None] = asyncio.Queue()
        self._sender = self._loop.create_task(self._send())
        self._token = _sink.set(self.log)

    def _put(self, send: Callable[[], Awaitable[None]] | None) -> None:
        if self.ctx is None and send is not None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._queue.put_nowait(send)
        else:  # a sync tool on its thread
            self._loop.call_soon_threadsafe(self._queue.put_nowait, send)

    def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """One progress report (a ``tools.mcp.progress`` reporter; the SDK drops the reports
        of a caller that sent no progress token)."""
        report = (float(progress), None if total is None else float(total), message)
        ctx = self.ctx
        if ctx is not None:
            self._put(lambda: ctx.session.report_progress(*report))

    def log(self, record: logging.LogRecord) -> None:
        from mcp.types import LoggingMessageNotification, LoggingMessageNotificationParams

        level = cast("LoggingLevel", mcp_level(record.levelno))
        ctx = self.ctx
        if ctx is None or level not in self._levels:
            return
        params = LoggingMessageNotificationParams(
            level=level, data=record.getMessage(), logger=record.name
        )
        notification = LoggingMessageNotification(params=params)
        # On the request's own stream (at 2026-07-28 the only one it may take).
        self._put(lambda: ctx.session.send_notification(notification, ctx.request_id))

    async def _send(self) -> None:
        while (send := await self._queue.get()) is not None:
            with suppress(Exception):  # a caller gone: the call still ends as it ends
                await send()

    async def close(self) -> None:
        """Send what was made (made before the call ended: queued already)."""
        with suppress(ValueError):  # closed in another context than it was opened in
            _sink.reset(self._token)
        self._queue.put_nowait(None)
        await self._sender
