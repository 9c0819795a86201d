"""Runs and approvals over HTTP: start (JSON or SSE), status, list, events, cancel, answer.

Every route goes through the run layer's one seam (``runs.backend.RunBackend``, the app's
``state.backend``): the same code serves runs in process and runs on the queue's workers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from hermes_agent.runs.backend import RunBackend, RunView
from hermes_agent.runs.keys import KeyStore
from hermes_agent.runs.principal import Principal
from hermes_agent.runs.request import RunRequest
from hermes_agent.runs.settings import ServiceSettings
from hermes_agent.runs.status import STOP_CODES
from hermes_agent.server.api_models import (
    AUTHENTICATED,
    EVENT_STREAM,
    RUN_HEADERS,
    ApprovalAnsweredBody,
    CancelBody,
    ErrorBody,
    QueuedBody,
    RunBody,
    RunListBody,
    RunResultBody,
    errors,
)
from hermes_agent.server.auth import CurrentUser, current_user
from hermes_agent.server.middleware import with_caller_language
from hermes_agent.server.sse import EventStreamResponse, frames, to_json

router = APIRouter(prefix="/v1")


class ApprovalAnswer(BaseModel):
    """The body of ``POST /v1/approvals/{id}``."""

    model_config = ConfigDict(extra="forbid")

    approved: bool
    reason: str = ""


def json_response(data: Any, status_code: int = 200) -> Response:
    """JSON that tolerates values JSON cannot hold (shown as their str)."""
    return Response(to_json(data), status_code=status_code, media_type="application/json")


def _backend(request: Request) -> RunBackend:
    backend: RunBackend = request.app.state.backend
    return backend


def _settings(request: Request) -> ServiceSettings:
    settings: ServiceSettings = request.app.state.settings
    return settings


def run_headers(request_id: str) -> dict[str, str]:
    """Where a run can be looked up, on every answer that starts one."""
    return {"X-Run-Id": request_id, "Location": f"/v1/runs/{request_id}"}


def finished_status(view: RunView) -> int:
    """The HTTP status of a plain POST's answer: what happened to the run, so that a client
    can tell success from failure without reading the body (docs/service.md, "Status codes").

    ``completed`` is 200 (a partial answer, result status 206, included); a run that failed
    with a result answers with the result's own status (400 refused input, 422 an answer that
    never matched ``output_schema``, 500 a stage or a hook, 502 the model); one that stopped
    without a result with its stop code (409 cancelled, 504 timed out, 500 failed, 503
    interrupted); 202 while a tool call waits for an approval."""
    if view.status == "completed":
        return 200
    if view.result is not None:
        code = int(view.result.get("status") or 500)
        return code if code >= 400 else 500
    if view.status == "waiting_approval" or view.pending_approvals:
        return 202
    return STOP_CODES.get(view.status, 500)


def finished_response(view: RunView) -> Response:
    """What a plain POST answers once the run is over or waits for an approval: the result
    when there is one (success or not), the run otherwise; the status says which."""
    body = view.result if view.result is not None else view.to_dict()
    return Response(
        to_json(body),
        finished_status(view),
        media_type="application/json",
        headers=run_headers(view.request_id),
    )


def queued_response(view: RunView) -> Response:
    """``202`` with where to follow a run that is accepted and not waited for."""
    rid = view.request_id
    body = {
        "request_id": rid,
        "session_id": view.session_id,
        "status": view.status,
        "status_url": f"/v1/runs/{rid}",
        "events_url": f"/v1/runs/{rid}/events",
        "source": view.source,
    }
    return Response(to_json(body), 202, media_type="application/json", headers=run_headers(rid))


def event_stream(request: Request, items: Any, request_id: str) -> Response:
    settings = _settings(request)
    response = EventStreamResponse(frames(items), settings.send_timeout_s)
    response.headers.update(run_headers(request_id))
    return response


def responds_async(prefer: str | None) -> bool:
    """``Prefer: respond-async`` (RFC 7240): answer 202 as soon as the run is started."""
    if not prefer:
        return False
    tokens = (part.split(";")[0].strip().lower() for part in prefer.split(","))
    return "respond-async" in tokens


@router.post(
    "/runs",
    response_model=RunResultBody,
    responses={
        200: {
            "description": "The run completed: its result; with `stream: true`, its events "
            "(whatever the ending: the last event says it)",
            "content": EVENT_STREAM,
            "headers": RUN_HEADERS,
        },
        202: {
            "model": RunBody | QueuedBody,
            "description": "A tool call waits for an approval; with `Prefer: respond-async` "
            "the run was started, or with `execution: queue` queued (where to follow it)",
            "headers": RUN_HEADERS,
        },
        400: {
            "model": ErrorBody | RunResultBody,
            "description": "The body is not valid JSON, or the run refused its input (then "
            "the whole result, status 400, run status `failed`)",
            "headers": RUN_HEADERS,
        },
        409: {"model": RunBody, "description": "The run was cancelled", "headers": RUN_HEADERS},
        **errors(413, 429, 503, 401),
        422: {
            "model": ErrorBody | RunResultBody,
            "description": "The request was refused before it ran, or the run's answer never "
            "matched `output_schema` (then the whole result, status 422, run status `failed`)",
            "headers": RUN_HEADERS,
        },
        500: {
            "model": RunResultBody | RunBody,
            "description": "The run failed: a stage or a hook (the result, status 500), or "
            "unexpectedly (the run, status `failed`)",
            "headers": RUN_HEADERS,
        },
        502: {
            "model": RunResultBody,
            "description": "The run failed: the model, after its retries (the result, status "
            "502, run status `failed`)",
            "headers": RUN_HEADERS,
        },
        504: {
            "model": RunBody,
            "description": "The run took longer than run_timeout_s (run status `timed_out`)",
            "headers": RUN_HEADERS,
        },
    },
)
async def create_run(
    body: RunRequest,
    request: Request,
    user: CurrentUser,
    prefer: Annotated[
        str | None,
        Header(
            description="`respond-async`: answer 202 with the run's id as soon as it has "
            "started, not when it ends (RFC 7240)"
        ),
    ] = None,
) -> Response:
    """Start a run: the ``RunResult`` JSON (HTTP status as the run ended: docs/service.md),
    ``202`` with the pending approvals (or, with ``Prefer: respond-async`` or ``execution:
    queue``, with where to follow it), or with ``stream: true`` the run's events as
    Server-Sent Events. Every answer for a run that started names it in ``X-Run-Id``."""
    backend, settings = _backend(request), _settings(request)
    body = with_caller_language(body, request.headers.get("accept-language"))
    detached = responds_async(prefer) and not body.stream
    listening = body.stream or (backend.answers_plain_posts and not detached)
    view = await backend.start(user, body, listening=listening)
    rid = view.request_id
    if body.stream:
        items = await backend.events(rid, user, 0, settings.keepalive_s, started=True)
        return event_stream(request, items, rid)
    if detached or not backend.answers_plain_posts:
        response = queued_response(view)
        if detached:
            response.headers["Preference-Applied"] = "respond-async"
        return response
    return finished_response(await backend.wait(rid, user, started=True))


@router.get("/runs/{request_id}", response_model=RunBody, responses=errors(404, *AUTHENTICATED))
async def get_run(request_id: str, request: Request, user: CurrentUser) -> Response:
    """A run's status and result, one shape whichever engine ran it: from this process, the
    queue's store, or the store's audit records."""
    return json_response((await _backend(request).view(request_id, user)).to_dict())


@router.get("/runs", response_model=RunListBody, responses=errors(*AUTHENTICATED))
async def list_runs(
    request: Request,
    user: CurrentUser,
    session_id: str | None = None,
    status: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    """The caller's runs, newest first."""
    runs = await _backend(request).runs(user, session_id, status, limit)
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
    keepalive = _settings(request).keepalive_s
    items = await _backend(request).events(request_id, user, last_event_id, keepalive)
    return event_stream(request, items, request_id)


@router.post(
    "/runs/{request_id}/cancel",
    response_model=CancelBody,
    responses=errors(404, 413, *AUTHENTICATED),
)
async def cancel_run(request_id: str, request: Request, user: CurrentUser) -> Response:
    """Cancel a run in flight: its model request, its async and subprocess tools; answers
    once it has stopped (a queued run: once it is marked cancelled; its worker stops at its
    next heartbeat). ``still_running`` names the calls a cancel cannot stop (a sync
    in-process tool runs to its end; its result goes to the trail as ``late_result``)."""
    cancelled, view = await _backend(request).cancel(request_id, user)
    body = {"request_id": request_id, "cancelled": cancelled, "status": view.status}
    if view.still_running:
        body["still_running"] = view.still_running
    return json_response(body)


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
    await _backend(request).answer(approval_id, user, body.approved, reason)
    return json_response({"approval_id": approval_id, "approved": body.approved, "reason": reason})
