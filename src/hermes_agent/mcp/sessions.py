"""Who may open how many MCP sessions over streamable HTTP: the door's ASGI guard.

The SDK's session manager keeps one pool of sessions for everyone (10,000 by default, each
kept 30 minutes after its last request): one key could fill it and lock every other user out.
Here every session belongs to the user who opened it, and that user holds at most
``max_sessions_per_user`` at once — an opening request beyond it is ``429`` (a JSON-RPC error
with the request's own id, read from its body here: the SDK never sees it); other users are
not affected. A session with no request in flight for ``idle_timeout_s`` is closed by the SDK
(given the same timeout) and stops counting. A session id is good only for the user who
opened it (another user's gets the ``404`` an unknown id gets).

The guard also answers ``401`` for a request without a valid API key when the door has keys
(anonymous requests never reach the MCP layer).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from hermes_agent.runs.principal import Principal

SESSION_HEADER = b"mcp-session-id"
DEFAULT_MAX_SESSIONS_PER_USER = 16
DEFAULT_IDLE_TIMEOUT_S = 300.0
_ID_BODY_BYTES = 64 * 1024
"""How much of a refused request's body is read to answer with its id."""

Identify = Callable[[str | None], Awaitable[Principal | None]]
"""Who sends an ``Authorization`` header value (``None`` for no valid key)."""


@dataclass(slots=True)
class _Session:
    user: str
    in_flight: int = 1
    last_active: float = 0.0


class SessionsPerUser:
    """ASGI middleware in front of the SDK's streamable HTTP app: authenticates each request
    (``identify``) and counts each user's sessions.

    A session is counted from the answer that gives its id until it has been idle (no request
    in flight) for ``idle_timeout_s``, the SDK answers ``404`` for it, or it is deleted. The
    clock starts when this guard sees a request end, never before the SDK's own does, so the
    SDK has closed a session by the time it stops counting here."""

    def __init__(
        self,
        app: Any,
        *,
        identify: Identify,
        max_sessions_per_user: int = DEFAULT_MAX_SESSIONS_PER_USER,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.identify = identify
        self.limit = max_sessions_per_user
        self.idle_timeout_s = idle_timeout_s
        self.clock = clock
        self._sessions: dict[str, _Session] = {}
        self._by_user: dict[str, set[str]] = {}
        self._opening: dict[str, int] = {}  # opening requests not yet answered, per user

    def held(self, user: str) -> int:
        """Sessions ``user`` holds now (opening ones included)."""
        self._forget_idle(user)
        return len(self._by_user.get(user, ())) + self._opening.get(user, 0)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        authorization = headers.get(b"authorization")
        principal = await self.identify(authorization.decode("latin-1") if authorization else None)
        if principal is None:
            from starlette.responses import JSONResponse

            detail = "missing or invalid API key: send 'Authorization: Bearer <key>'"
            response = JSONResponse({"detail": detail}, 401, {"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        user = principal.user_id
        session_id = headers.get(SESSION_HEADER)
        if session_id is None:
            await self._open(user, scope, receive, send)
        else:
            await self._continue(user, session_id.decode("latin-1"), scope, receive, send)

    async def _open(self, user: str, scope: Any, receive: Any, send: Any) -> None:
        if self.held(user) >= self.limit:
            retry = self._retry_after(user)
            message = (
                f"this user holds {self.limit} MCP sessions already (max_sessions_per_user); "
                "end one (DELETE) or let one go idle"
            )
            await _refuse(scope, receive, send, 429, message, {"Retry-After": str(retry)})
            return
        self._opening[user] = self._opening.get(user, 0) + 1
        opened: list[str] = []

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                given = dict(message.get("headers", [])).get(SESSION_HEADER)
                if given is not None:  # the SDK opened a session: it is this user's
                    session_id = given.decode("latin-1")
                    self._sessions[session_id] = _Session(user)
                    self._by_user.setdefault(user, set()).add(session_id)
                    opened.append(session_id)
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            self._opening[user] -= 1
            if not self._opening[user]:
                del self._opening[user]
            for session_id in opened:
                self._ended_request(session_id)

    async def _continue(
        self, user: str, session_id: str, scope: Any, receive: Any, send: Any
    ) -> None:
        session = self._sessions.get(session_id)
        if session is not None and session.user == user:
            self._forget_idle(user)
            session = self._sessions.get(session_id)
        if session is None or session.user != user:
            await _refuse(scope, receive, send, 404, "Session not found")
            return
        session.in_flight += 1
        gone = False

        async def watch(message: Any) -> None:
            nonlocal gone
            if message["type"] == "http.response.start":
                status = message["status"]
                gone = status == 404 or (scope.get("method") == "DELETE" and status < 400)
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            self._ended_request(session_id)
            if gone:
                self._forget(session_id)

    def _ended_request(self, session_id: str) -> None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.in_flight -= 1
            session.last_active = self.clock()

    def _idle_for(self, session: _Session) -> float:
        return -1.0 if session.in_flight else self.clock() - session.last_active

    def _forget_idle(self, user: str) -> None:
        for session_id in list(self._by_user.get(user, ())):
            if self._idle_for(self._sessions[session_id]) >= self.idle_timeout_s:
                self._forget(session_id)

    def _forget(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        held = self._by_user.get(session.user)
        if held is not None:
            held.discard(session_id)
            if not held:
                del self._by_user[session.user]

    def _retry_after(self, user: str) -> int:
        """Seconds until one of ``user``'s idle sessions stops counting (the idle timeout
        when all are busy)."""
        idle = [
            self.idle_timeout_s - self._idle_for(self._sessions[s])
            for s in self._by_user.get(user, ())
            if not self._sessions[s].in_flight
        ]
        return max(1, math.ceil(min(idle, default=self.idle_timeout_s)))


async def _refuse(
    scope: Any,
    receive: Any,
    send: Any,
    status: int,
    message: str,
    headers: dict[str, str] | None = None,
) -> None:
    """A JSON-RPC error answering the request's own id (``_request_id``), ``null`` where it
    has none to read."""
    from starlette.responses import JSONResponse

    request_id = await _request_id(receive)
    body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32600, "message": message}}
    await JSONResponse(body, status, headers=headers)(scope, receive, send)


async def _request_id(receive: Any) -> str | int | float | None:
    """The ``id`` of the JSON-RPC request in the body, read here because the SDK never sees
    it. ``None`` (JSON-RPC's ``null``, for an id that cannot be found) for a body that is no
    single request with an id: none (a GET, a DELETE), a notification, a batch, not JSON, or
    longer than ``_ID_BODY_BYTES`` (not read further: a refused request costs little)."""
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None  # the client went away
        body += message.get("body", b"")
        if len(body) > _ID_BODY_BYTES:
            return None
        if not message.get("more_body", False):
            break
    try:
        request = json.loads(body)
    except ValueError:
        return None
    found = request.get("id") if isinstance(request, dict) else None
    if isinstance(found, bool) or not isinstance(found, str | int | float):
        return None
    return found
