"""One ASGI middleware for what every HTTP request gets: a request id, the body size limit
(413), one JSON access-log line, and — when the served agent is traced — the caller's W3C trace
context (``traceparent``) as the parent of the runs the request starts."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hermes_agent import tracing
from hermes_agent.runs.principal import is_loopback

access_log = logging.getLogger("hermes_agent.server.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class _BodyTooLarge(Exception):
    pass


class ServiceMiddleware:
    """Request ids (``X-Request-ID``, the client's if valid), body limit, access log."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("x-request-id", "")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        state: dict[str, Any] = scope.setdefault("state", {})
        state["request_id"] = request_id
        started = time.perf_counter()
        status = {"code": 0, "sent": False}
        limit = self.max_body_bytes
        received = 0
        trace_token = _incoming_trace(scope, headers)

        too_large = False

        async def counting_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    too_large = True
                    raise _BodyTooLarge
            return message

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                status["sent"] = True
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            await send(message)

        async def tagged_send(message: Message) -> None:
            if too_large:  # the app answered a body it could not finish reading (FastAPI: 400)
                if not status["sent"]:
                    await _too_large(tagged, limit)
                return
            await tagged(message)

        try:
            length = headers.get("content-length", "")
            if scope["type"] == "http" and length.isdigit() and int(length) > limit:
                await _too_large(tagged_send, limit)
                return
            await self.app(scope, counting_receive, tagged_send)
        except _BodyTooLarge:
            if not status["sent"]:
                await _too_large(tagged, limit)
        finally:
            if trace_token is not None:
                tracing.detach(trace_token)
            _log_access(scope, state, request_id, status["code"], started)


def _incoming_trace(scope: Scope, headers: dict[str, str]) -> object | None:
    """The request's trace context made current when the app's agent is traced (a run task
    started by the request copies it); ``None`` (and nothing imported) otherwise."""
    agent = getattr(getattr(scope.get("app"), "state", None), "agent", None)
    return None if agent is None else tracing.attach_incoming(agent, headers)


async def _too_large(send: Send, limit: int) -> None:
    body = json.dumps(
        {"detail": f"the request body is larger than {limit} bytes (max_body_bytes); send less"}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _log_access(
    scope: Scope, state: dict[str, Any], request_id: str, status: int, started: float
) -> None:
    if not access_log.isEnabledFor(logging.INFO):
        return
    line = {
        "ts": time.time(),
        "request_id": request_id,
        "type": scope["type"],
        "method": scope.get("method", "WS"),
        "path": scope["path"],
        "status": status,
        "duration_ms": round((time.perf_counter() - started) * 1000, 2),
        "user": state.get("user_id"),
        "client": scope["client"][0] if scope.get("client") else None,
    }
    access_log.info(json.dumps(line))


def _loopback_host(value: str) -> bool:
    """Whether a Host header (``name[:port]``, ``[v6]:port``) or an Origin's host names this
    machine's loopback."""
    host = value.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return is_loopback(host)


class LoopbackOnly:
    """For ``auth: none`` (loopback only, no keys): a web page the local user visits must not
    drive the service. A request whose ``Host`` is not a loopback name is refused (DNS
    rebinding: a foreign name resolved to 127.0.0.1), and so is one — HTTP or WebSocket — whose
    ``Origin`` is another site (a page's fetch, or cross-site WebSocket hijacking). Clients that
    are not browsers send no ``Origin`` and are unaffected; the console is same-origin."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        problem = None
        if not _loopback_host(headers.get("host", "")):
            problem = (
                "this service runs with auth: none and answers only requests addressed to "
                "localhost or 127.0.0.1 (the Host header names another)"
            )
        origin = headers.get("origin")
        if problem is None and origin is not None and origin != "null":
            from urllib.parse import urlsplit

            if not _loopback_host(urlsplit(origin).netloc):
                problem = (
                    f"requests from the web page at {origin!r} are refused: with auth: none "
                    "only pages served from this machine may call the service"
                )
        if problem is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "origin refused"})
            return
        body = json.dumps({"detail": problem}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})
