"""Runs and approvals over HTTP: start (JSON or SSE), status, list, events, cancel, answer.

With ``execution: queue`` each route hands over to ``server.queued`` (the runs are on the
workers, their state in the store)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from hermes_agent.audit.records import Role
from hermes_agent.server import queued
from hermes_agent.server.api_models import (
    AUTHENTICATED,
    EVENT_STREAM,
    ApprovalAnsweredBody,
    CancelBody,
    ErrorBody,
    QueuedBody,
    QueuedRunBody,
    RunListBody,
    RunResultBody,
    RunStatusBody,
    StoredRunBody,
    errors,
)
from hermes_agent.server.approvals import ApprovalAnswered
from hermes_agent.server.auth import CurrentUser, KeyStore, Principal, current_user
from hermes_agent.server.runs import Run, RunManager, RunRequest, client_session_id
from hermes_agent.server.settings import ServiceSettings
from hermes_agent.server.sse import EventStreamResponse, run_events, to_json
from hermes_agent.storage.base import Storage

router = APIRouter(prefix="/v1")

_FAILED_CODES = {"cancelled": 409, "timed_out": 504, "failed": 500}


class ApprovalAnswer(BaseModel):
    """The body of ``POST /v1/approvals/{id}``."""

    model_config = ConfigDict(extra="forbid")

    approved: bool
    reason: str = ""


def json_response(data: Any, status_code: int = 200) -> Response:
    """JSON that tolerates values JSON cannot hold (shown as their str)."""
    return Response(to_json(data), status_code=status_code, media_type="application/json")


def _manager(request: Request) -> RunManager:
    manager: RunManager = request.app.state.manager
    return manager


def _settings(request: Request) -> ServiceSettings:
    settings: ServiceSettings = request.app.state.settings
    return settings


def finished_response(run: Run, manager: RunManager) -> Response:
    """What a plain POST answers once the run is over or waits for an approval."""
    if run.status == "completed":
        assert run.result is not None
        # An answer that never matched the request's output_schema: the whole result, as 422.
        return json_response(run.result, 422 if run.result["status"] == 422 else 200)
    summary = run.summary(manager.pending(run))
    if run.status == "waiting_approval" or summary["pending_approvals"]:
        return json_response(summary, 202)
    return json_response(summary, _FAILED_CODES.get(run.status, 200))


@router.post(
    "/runs",
    response_model=RunResultBody,
    responses={
        200: {
            "description": "The run's result; with `stream: true`, its events",
            "content": EVENT_STREAM,
        },
        202: {
            "model": RunStatusBody | QueuedBody,
            "description": "A tool call waits for an approval; with `execution: queue`, the "
            "run was queued",
        },
        409: {"model": RunStatusBody, "description": "The run was cancelled"},
        500: {"model": RunStatusBody, "description": "The run failed"},
        504: {"model": RunStatusBody, "description": "The run took longer than run_timeout_s"},
        **errors(400, 413, 429, 503, *AUTHENTICATED),
        422: {
            "model": ErrorBody | RunResultBody,
            "description": "The request was refused, or the answer never matched "
            "`output_schema` (then the whole result, status 422)",
        },
    },
)
async def create_run(body: RunRequest, request: Request, user: CurrentUser) -> Response:
    """Start a run: the ``RunResult`` JSON, ``202`` with the pending approvals, or with
    ``stream: true`` the run's events as Server-Sent Events."""
    settings, manager = _settings(request), _manager(request)
    queue = queued.queue_of(request)
    if queue is not None:
        return await queued.create_run(queue, body, user)
    run = await manager.start(user, body)
    if body.stream:
        return EventStreamResponse(
            run_events(run, 0, settings.keepalive_s), settings.send_timeout_s
        )
    try:
        while not run.done and not manager.pending(run):
            await run.changed()
    finally:
        run.detach()
    return finished_response(run, manager)


def _owned_run(request: Request, request_id: str, user: Principal) -> Run:
    run = _manager(request).get(request_id, user.user_id, admin=user.admin)
    if run is None:
        raise HTTPException(404, f"no run {request_id!r} in memory; GET /v1/runs/{request_id}")
    return run


_STOPPED_STATUS = {409: "cancelled", 504: "timed_out"}


def stored_status(status: str, status_code: int) -> str:
    """A run's status as the API names it, from the store's summary of its trail: the output
    record's ``ok``/``error``, a service's ``stopped`` record (its code says why), or
    ``incomplete`` (the trail was cut short: the process died mid-run)."""
    if status == "ok":
        return "completed"
    if status == "stopped":
        return _STOPPED_STATUS.get(status_code, "failed")
    return "incomplete" if status == "incomplete" else "failed"


def stored_run(storage: Storage, request_id: str, user: Principal) -> dict[str, Any] | None:
    """A run's status from its audit records, if the caller owns it."""
    records = storage.records(request_id)
    if not records:
        return None
    session = client_session_id(user.user_id, records[0].session_id)
    if session is None and not user.admin:
        return None
    last = records[-1]
    output = last.stage == "OutputRenderer"
    stopped = last.role == Role.STOPPED
    return {
        "request_id": request_id,
        "session_id": session if session is not None else records[0].session_id,
        "status": stored_status(
            last.status if output else "stopped" if stopped else "incomplete", last.status_code
        ),
        "status_code": last.status_code,
        "output": last.content if output else None,
        "records": len(records),
        "source": "store",
    }


@router.get(
    "/runs/{request_id}",
    response_model=RunStatusBody | StoredRunBody | QueuedRunBody,
    responses=errors(404, *AUTHENTICATED),
)
async def get_run(request_id: str, request: Request, user: CurrentUser) -> Response:
    """A run's status and result: from memory, or from the store's audit records (with
    ``execution: queue``, the queued run's state in the store)."""
    queue = queued.queue_of(request)
    if queue is not None:
        return await queued.get_run(queue, request_id, user)
    manager = _manager(request)
    run = manager.get(request_id, user.user_id, admin=user.admin)
    if run is not None:
        return json_response(run.summary(manager.pending(run)))
    storage: Storage = request.app.state.storage
    found = await run_in_threadpool(stored_run, storage, request_id, user)
    if found is None:
        raise HTTPException(404, f"no run {request_id!r}")
    return json_response(found)


@router.get("/runs", response_model=RunListBody, responses=errors(*AUTHENTICATED))
async def list_runs(
    request: Request,
    user: CurrentUser,
    session_id: str | None = None,
    status: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    """The caller's runs, newest first: those in memory, then those in the store."""
    queue = queued.queue_of(request)
    if queue is not None:
        return await queued.list_runs(queue, user, session_id, status, limit)
    manager = _manager(request)
    storage: Storage = request.app.state.storage
    found: dict[str, dict[str, Any]] = {}
    for run in reversed(manager.runs.values()):
        if run.owner == user.user_id and session_id in (None, run.session_id):
            found[run.id] = {k: v for k, v in run.summary([]).items() if k != "result"}

    def from_store() -> list[dict[str, Any]]:
        rows = []
        for row in storage.requests(limit=limit * 4):
            session = client_session_id(user.user_id, row["session_id"])
            if session is None or session_id not in (None, session):
                continue
            rows.append(
                {
                    "request_id": row["request_id"],
                    "session_id": session,
                    "status": stored_status(row["status"], row["status_code"]),
                    "created": datetime.fromisoformat(row["started"]).timestamp(),
                    "source": "store",
                }
            )
        return rows

    for row in await run_in_threadpool(from_store):
        found.setdefault(row["request_id"], row)
    runs = [r for r in found.values() if status in (None, r["status"])][:limit]
    return json_response({"runs": runs})


def stream_user(
    request: Request,
    access_token: Annotated[
        str | None,
        Query(
            description="The API key, for a browser's EventSource (it cannot send headers); "
            "anywhere else send Authorization: Bearer <key>"
        ),
    ] = None,
) -> Principal:
    """The caller of an event stream: the ``Authorization`` header, or ``?access_token=``."""
    settings = _settings(request)
    if access_token and settings.auth == "keys" and "authorization" not in request.headers:
        keys: KeyStore = request.app.state.keys
        principal = keys.lookup(access_token)
        if principal is not None:
            request.state.user_id = principal.user_id
            return principal
    return current_user(request)


@router.get(
    "/runs/{request_id}/events",
    response_model=None,
    response_class=EventStreamResponse,
    status_code=200,
    responses={
        200: {"description": "The run's events", "content": EVENT_STREAM},
        **errors(404, *AUTHENTICATED),
    },
)
async def run_events_stream(
    request_id: str,
    request: Request,
    user: Annotated[Principal, Depends(stream_user)],
    last_event_id: Annotated[int, Header(alias="Last-Event-ID", ge=0)] = 0,
) -> Response:
    """Follow a run: every event after ``Last-Event-ID``, then live ones, then the end. A
    browser's ``EventSource`` may give its key as ``?access_token=``."""
    queue = queued.queue_of(request)
    if queue is not None:
        return await queued.run_events(queue, request_id, user, last_event_id)
    run = _owned_run(request, request_id, user)
    settings = _settings(request)
    run.attach()
    return EventStreamResponse(
        run_events(run, last_event_id, settings.keepalive_s), settings.send_timeout_s
    )


@router.post(
    "/runs/{request_id}/cancel",
    response_model=CancelBody,
    responses=errors(404, 413, *AUTHENTICATED),
)
async def cancel_run(request_id: str, request: Request, user: CurrentUser) -> Response:
    """Cancel a run in flight, its tools with it; answers once it has stopped (a queued run:
    once it is marked cancelled; its worker stops at its next heartbeat)."""
    queue = queued.queue_of(request)
    if queue is not None:
        return await queued.cancel_run(queue, request_id, user)
    run = _owned_run(request, request_id, user)
    cancelled = _manager(request).cancel(run)
    if cancelled and run.task is not None:
        await asyncio.wait({run.task}, timeout=10)
    return json_response({"request_id": run.id, "cancelled": cancelled, "status": run.status})


@router.post(
    "/approvals/{approval_id}",
    response_model=ApprovalAnsweredBody,
    responses=errors(400, 404, 409, 413, *AUTHENTICATED),
)
async def answer_approval(
    approval_id: str,
    body: ApprovalAnswer,
    request: Request,
    user: CurrentUser,
) -> Response:
    """Approve or deny a pending tool call (once; only the run's owner)."""
    reason = body.reason or f"{'approved' if body.approved else 'denied'} by {user.user_id}"
    queue = queued.queue_of(request)
    if queue is not None:
        return await queued.answer_approval(queue, approval_id, user, body.approved, reason)
    manager = _manager(request)
    pending = manager.approvals.get(approval_id, user.user_id)
    if pending is None:
        raise HTTPException(404, f"no approval {approval_id!r}")
    try:
        manager.approvals.answer(pending, body.approved, reason)
    except ApprovalAnswered:
        raise HTTPException(409, f"approval {approval_id!r} was answered already") from None
    return json_response({"approval_id": approval_id, "approved": body.approved, "reason": reason})
