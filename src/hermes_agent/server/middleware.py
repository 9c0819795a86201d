"""One ASGI middleware for what every HTTP request gets: a request id, the body size limit
(413), one JSON access-log line, the security headers of every answer (no sniffing, no
referrer, no framing), and — when the served agent is traced — the caller's W3C trace context
(``traceparent``) as the parent of the runs the request starts; ``BrowserGuard``, which
keeps other sites' pages from driving the service (Host and Origin checks); and
``not_json_body``, the 415 every route's JSON body gets when it was sent as something else;
``LanguageMiddleware``, error details in the caller's language (``Accept-Language``)."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hermes_agent import tracing
from hermes_agent.messages import error_detail, preferred_language
from hermes_agent.runs.principal import is_loopback
from hermes_agent.runs.request import RunRequest

access_log = logging.getLogger("hermes_agent.server.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
"""Sent with every HTTP answer: no content-type sniffing, no ``Referer`` (a URL may carry a
stream token), never inside another site's frame (clickjacking)."""
FRAMING_CSP = (b"content-security-policy", b"frame-ancestors 'none'")
"""Added where an answer has no policy of its own (the console's holds the same directive)."""


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
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                status["code"] = message["status"]
                status["sent"] = True
                given = list(message.get("headers", []))
                names = {bytes(name).lower() for name, _ in given}
                extra = [h for h in (*SECURITY_HEADERS, FRAMING_CSP) if h[0] not in names]
                message["headers"] = [*given, *extra, (b"x-request-id", request_id.encode())]
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


def is_json_media_type(value: str | None) -> bool:
    """Whether a ``Content-Type`` names JSON (``application/json``, ``…+json``; any parameters)."""
    kind = (value or "").partition(";")[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


def not_json_body(request: Request, issues: Sequence[Any]) -> JSONResponse | None:
    """415 for a request whose JSON body came without a JSON ``Content-Type`` (none at all, or
    ``text/plain``, or a form): FastAPI then reads the body as text and reports a schema
    mismatch (422) that names no cause. Called with the issues of the request's validation
    error, for every route that reads a JSON body; ``None`` when the cause is something else."""
    given = request.headers.get("content-type")
    if is_json_media_type(given):
        return None
    unread = any(
        tuple(issue.get("loc", ()))[:1] == ("body",) and isinstance(issue.get("input"), str | bytes)
        for issue in issues
        if isinstance(issue, dict)
    )
    if not unread:
        return None
    sent = f"Content-Type {given[:100]!r}" if given else "no Content-Type"
    return JSONResponse(
        {
            "detail": f"the request body must be JSON, sent with Content-Type: "
            f"application/json (this one came with {sent})"
        },
        415,
    )


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
    return is_loopback(_host_name(value))


def _host_name(value: str) -> str:
    """The name of a Host header or an Origin's netloc, without its port."""
    host = value.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


def _origin(value: str) -> str:
    """An origin as browsers send it (``scheme://host[:port]``, lower case, no path)."""
    parts = urlsplit(value.strip())
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else ""


class BrowserGuard:
    """What a web page in the user's browser may do with the service.

    - **Host** (when the service listens on loopback, or runs with ``auth: none``): only
      loopback names and ``allowed_hosts`` are served; any other is 421. A page on
      ``evil.example`` whose name was made to resolve to 127.0.0.1 (DNS rebinding) sends its
      own name, so it cannot read the service as if it were its own origin.
    - **Origin** on the WebSocket, under every auth mode: only the service's own origin (the
      one the ``Host`` names) and ``allowed_origins`` may open one; any other, ``null``
      included (a sandboxed frame, a file), is 403. A browser sends its cookies, client
      certificates and a proxy's credentials with a cross-site WebSocket, and no CORS
      preflight guards it (cross-site WebSocket hijacking).
    - **Origin** on HTTP with ``auth: none``: the same rule, 403 — there is no key a foreign
      page would need, and a "simple" ``fetch`` (``mode: no-cors``, a form post) is sent
      without a preflight. With keys, a foreign page cannot send the ``Authorization``
      header without CORS, which the service does not grant unless told (``CORSMiddleware``).

    Clients that are not browsers send no ``Origin`` and are unaffected."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        auth: str,
        host: str,
        allowed_hosts: Sequence[str] = (),
        allowed_origins: Sequence[str] = (),
    ) -> None:
        self.app = app
        self.auth = auth
        self.check_host = auth == "none" or is_loopback(host)
        self.hosts = {h.strip().lower() for h in allowed_hosts}
        self.origins = {_origin(o) for o in allowed_origins} - {""}

    def host_ok(self, host: str) -> bool:
        """Whether a request with this ``Host`` header is served."""
        host = host.strip().lower()
        return _loopback_host(host) or host in self.hosts or _host_name(host) in self.hosts

    def origin_ok(self, origin: str, host: str) -> bool:
        """Whether a page of ``origin`` may call a service reached as ``host``."""
        given = _origin(origin)
        if not given:  # "null", or not an origin at all
            return False
        return given.partition("://")[2] == host.strip().lower() or given in self.origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        origin = headers.get("origin")
        if self.check_host and not self.host_ok(host):
            await _refuse(
                scope,
                send,
                421,
                "this service answers only requests addressed to localhost, 127.0.0.1 or its "
                "allowed_hosts (the Host header names another); add the name to "
                "service.allowed_hosts if it is yours",
            )
        elif (
            origin is not None
            and (scope["type"] == "websocket" or self.auth == "none")
            and not self.origin_ok(origin, host)
        ):
            await _refuse(
                scope,
                send,
                403,
                f"requests from the web page at {origin[:200]!r} are refused: only the "
                "service's own pages and its allowed_origins may call it from a browser",
            )
        else:
            await self.app(scope, receive, send)


async def _refuse(scope: Scope, send: Send, status: int, detail: str) -> None:
    """An HTTP answer with ``status``; for a WebSocket the same before the handshake when the
    server can send one (the ASGI denial response), else a plain 403 refusal."""
    body = json.dumps({"detail": detail}).encode()
    start: Message = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json")],
    }
    if scope["type"] == "websocket":
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": "refused"})
            return
        start["type"] = "websocket.http.response.start"
        await send(start)
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send(start)
    await send({"type": "http.response.body", "body": body})


class LanguageMiddleware:
    """The ``detail`` of an error answer (a JSON ``{"detail": "..."}`` with status ≥ 400, or
    the OpenAI facade's ``{"error": {"message": ...}}``) in the caller's language: the one
    ``Accept-Language`` prefers, else the service's (the served agent's ``language``). The
    shape stays the same and machine-readable fields (``type``, ``code``, a 422's list of
    issues) stay English; the English detail follows the translated sentence
    (``messages.error_detail``). Other answers pass untouched, streams included."""

    def __init__(self, app: ASGIApp, language: str = "en") -> None:
        self.app = app
        self.language = language

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"accept-language")
        language = preferred_language(given, self.language)
        if language == "en":
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        held: list[bytes] = []

        async def translating(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                if message["status"] >= 400 and _is_json(message):
                    start = message  # held until the whole (small) error body is in
                    return
                await send(message)
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            held.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = _translated(b"".join(held), start["status"], language)
            headers = [(k, v) for k, v in start["headers"] if bytes(k).lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, translating)


def with_caller_language(body: RunRequest, accept_language: str | None) -> RunRequest:
    """``body`` with a ``lang`` variable from ``Accept-Language`` (``en`` or ``zh``), so the
    runtime's own messages in its answer are in the caller's language; as it was when the
    header names neither or the request sets ``lang`` itself."""
    language = preferred_language(accept_language, "")
    if not language or (body.variables is not None and "lang" in body.variables):
        return body
    return body.model_copy(update={"variables": {**(body.variables or {}), "lang": language}})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _is_json(start: Message) -> bool:
    for key, value in start.get("headers", []):
        if bytes(key).lower() == b"content-type":
            return is_json_media_type(bytes(value).decode("latin-1"))
    return False


def _translated(body: bytes, status: int, language: str) -> bytes:
    """``body`` with its detail (or the facade's error message) in ``language``; as it was
    when it holds neither, or is not JSON after all."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict):
        return body
    if isinstance(data.get("detail"), str):
        data["detail"] = error_detail(status, data["detail"], language)
    elif isinstance(data.get("error"), dict) and isinstance(data["error"].get("message"), str):
        data["error"]["message"] = error_detail(status, data["error"]["message"], language)
    else:
        return body
    return json.dumps(data, ensure_ascii=False).encode()
