"""``/v1/ws``: runs, their events, approvals and cancels over one WebSocket.

Client → server: ``{"type": "run", <RunRequest fields>, "client_ref"?}``,
``{"type": "approve", "approval_id", "approved", "reason"?}``, ``{"type": "cancel",
"request_id"}``. Server → client: ``{"type": "started", "request_id", "session_id",
"client_ref"}``, ``{"type": "event", "request_id", "event_id", "event": <wire event>}``,
``{"type": "approval_answered", ...}``, ``{"type": "cancelled", ...}`` and ``{"type": "error",
"status", "detail", ...}``. Several runs may be in flight on one socket; a socket that drops
cancels nothing (reconnect with ``GET /v1/runs/{id}/events``). Every message goes through the
run layer's backend, so the same messages serve runs in process and runs on the queue.

The key comes in ``Authorization: Bearer <key>``, or — from a browser, whose ``WebSocket``
cannot send headers — as the second of two subprotocols, ``new WebSocket(url, ["bearer",
key])``; the server then answers with the subprotocol ``bearer`` (never the key). The key is
checked again before every message the client sends and every event pushed (``LiveCheck``, at
most one store lookup per ``key_check_s``): once it is revoked, the next message gets an
``error`` with ``status: 401`` and the socket closes with 1008. A page of another origin
cannot open a socket at all (``middleware.BrowserGuard``), and a user holds at most
``max_streams_per_user`` sockets and event streams (beyond: an ``error`` with ``status: 429``,
then close 1013).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from hermes_agent.errors import HermesAgentError
from hermes_agent.messages import error_detail, preferred_language
from hermes_agent.runs.backend import ApprovalConflict, RunBackend, RunNotFound
from hermes_agent.runs.gate import RunRejected
from hermes_agent.runs.keys import authenticate
from hermes_agent.runs.principal import LOCAL_USER, Principal
from hermes_agent.runs.request import RunRequest
from hermes_agent.server.auth import Credential, LiveCheck
from hermes_agent.server.middleware import with_caller_language
from hermes_agent.server.sse import OpenStreams

router = APIRouter()

BEARER_SUBPROTOCOL = "bearer"


@router.websocket("/v1/ws")
async def websocket_endpoint(websocket: WebSocket) -> None:
    """One client's socket."""
    state = websocket.app.state
    header = websocket.headers.get("authorization")
    offered = list(websocket.scope.get("subprotocols") or [])
    subprotocol = BEARER_SUBPROTOCOL if offered[:1] == [BEARER_SUBPROTOCOL] else None
    if header is None and subprotocol is not None and len(offered) == 2:
        header = f"Bearer {offered[1]}"
    if state.settings.auth == "none":
        user: Principal | None = Principal(LOCAL_USER)
        credential = Credential()
    else:
        user = await asyncio.to_thread(authenticate, state.keys, header)
        credential = Credential.of(header, {})
    if user is None:
        await websocket.close(code=1008, reason="missing or invalid API key")
        return
    await websocket.accept(subprotocol=subprotocol)
    # The socket speaks the handshake's Accept-Language (else the served agent's language) in
    # its error frames, and its runs answer in it, as the HTTP routes do.
    accept_language = websocket.headers.get("accept-language")
    language = preferred_language(accept_language, state.agent.language)
    streams: OpenStreams = state.streams
    if not streams.enter(user.user_id):
        detail = error_detail(429, streams.refusal(), language)
        await websocket.send_text(
            json.dumps({"type": "error", "status": 429, "detail": detail}, ensure_ascii=False)
        )
        await websocket.close(code=1013, reason="too many open streams")
        return
    session = _Socket(websocket, state.backend, user, state.settings.send_timeout_s)
    session.live, session.credential = state.live, credential
    session.language, session.accept_language = language, accept_language
    try:
        await session.serve()
    finally:
        streams.leave(user.user_id)
        for task in session.pumps:
            task.cancel()


class _Socket:
    def __init__(
        self, websocket: WebSocket, backend: RunBackend, user: Principal, send_timeout: float
    ) -> None:
        self.websocket = websocket
        self.backend = backend
        self.user = user
        self.send_timeout = send_timeout
        self.pumps: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self.live: LiveCheck | None = None
        self.credential = Credential()
        self.closed = False
        self.language = "en"
        self.accept_language: str | None = None

    async def standing(self) -> bool:
        """Whether the socket's key still stands; if not, say so and close (1008)."""
        if self.closed:
            return False
        if self.live is None or await self.live.stands(self.credential):
            return True
        if not self.closed:
            self.closed = True
            detail = "the API key of this socket was revoked; connect again with a valid key"
            try:
                await self._error(401, detail)
                await self.websocket.close(code=1008, reason="API key revoked")
            except (WebSocketDisconnect, RuntimeError, TimeoutError):
                pass  # gone already
        return False

    async def send(self, message: dict[str, Any]) -> None:
        async with self._lock:
            await asyncio.wait_for(
                self.websocket.send_text(json.dumps(message, ensure_ascii=False, default=str)),
                self.send_timeout,
            )

    async def serve(self) -> None:
        limit = self.websocket.app.state.settings.max_body_bytes
        while True:
            frame = await self.websocket.receive()
            if frame["type"] == "websocket.disconnect" or not await self.standing():
                return
            raw = frame.get("text")
            if raw is None:  # a binary frame
                await self._error(400, "send JSON in text frames")
                continue
            if len(raw) > limit or len(raw.encode("utf-8", "surrogatepass")) > limit:
                await self._error(
                    413, f"the message is larger than {limit} bytes (max_body_bytes); send less"
                )
                continue
            try:
                message = json.loads(raw)
                kind = message.pop("type") if isinstance(message, dict) else None
            except (ValueError, KeyError, RecursionError):  # deep nesting is invalid JSON too
                kind, message = None, {}
            handler = {"run": self._run, "approve": self._approve, "cancel": self._cancel}.get(
                kind if isinstance(kind, str) else ""
            )
            if handler is None:
                await self._error(400, "send a JSON object whose type is run, approve or cancel")
            elif (
                kind == "run"
            ):  # in a task: a run waiting for its session must not block the socket
                task = asyncio.create_task(handler(message))
                self.pumps.add(task)
                task.add_done_callback(self.pumps.discard)
            else:
                await handler(message)

    async def _error(self, status: int, detail: str, **extra: Any) -> None:
        detail = error_detail(status, detail, self.language)
        await self.send({"type": "error", "status": status, "detail": detail, **extra})

    async def _run(self, message: dict[str, Any]) -> None:
        client_ref = message.pop("client_ref", None)
        # A socket reads every event of its runs: their model turns are streamed from the first.
        message["stream"] = True
        try:
            request = with_caller_language(RunRequest(**message), self.accept_language)
        except ValidationError as exc:
            await self._error(422, str(exc), client_ref=client_ref)
            return
        try:
            view = await self.backend.start(self.user, request)
        except RunRejected as exc:
            await self._error(
                exc.status_code, exc.message, client_ref=client_ref, retry_after=exc.retry_after
            )
            return
        except HermesAgentError as exc:
            await self._error(422, str(exc), client_ref=client_ref)
            return
        await self.send(
            {
                "type": "started",
                "request_id": view.request_id,
                "session_id": view.session_id,
                "client_ref": client_ref,
            }
        )
        task = asyncio.create_task(self._pump(view.request_id, client_ref))
        self.pumps.add(task)
        task.add_done_callback(self.pumps.discard)

    async def _pump(self, request_id: str, client_ref: Any) -> None:
        keepalive = self.websocket.app.state.settings.keepalive_s
        try:
            items = await self.backend.events(request_id, self.user, 0, keepalive, started=True)
            async with aclosing(items) as following:
                async for item in following:
                    if not await self.standing():
                        return
                    if item is None:  # a keep-alive: nothing to send on a socket
                        continue
                    event_id, wire = item
                    await self.send(
                        {
                            "type": "event",
                            "request_id": request_id,
                            "client_ref": client_ref,
                            "event_id": event_id,
                            "event": wire,
                        }
                    )
        except (WebSocketDisconnect, RuntimeError, TimeoutError, RunNotFound):
            pass  # the socket is gone or stopped reading; the run goes on

    async def _approve(self, message: dict[str, Any]) -> None:
        approval_id = str(message.get("approval_id", ""))
        approved = message.get("approved")
        if not isinstance(approved, bool):
            await self._error(422, "approve needs approved: true or false", approval_id=approval_id)
            return
        verb = "approved" if approved else "denied"
        reason = str(message.get("reason") or f"{verb} by {self.user.user_id}")
        try:
            await self.backend.answer(approval_id, self.user, approved, reason)
        except RunNotFound as exc:
            await self._error(404, exc.message, approval_id=approval_id)
            return
        except ApprovalConflict as exc:
            await self._error(409, exc.message, approval_id=approval_id)
            return
        await self.send(
            {"type": "approval_answered", "approval_id": approval_id, "approved": approved}
        )

    async def _cancel(self, message: dict[str, Any]) -> None:
        request_id = str(message.get("request_id", ""))
        try:
            cancelled, _ = await self.backend.cancel(request_id, self.user)
        except RunNotFound:
            await self._error(404, f"no run {request_id!r}", request_id=request_id)
            return
        await self.send({"type": "cancelled", "request_id": request_id, "cancelled": cancelled})
