"""The web console: ``/console/`` serves one page built from plain ES modules and CSS shipped in
the package (``server/console/``: no build step, nothing fetched from elsewhere), and the few
read endpoints it needs beyond the service API, behind the same keys:

- ``GET /v1/console/me``: who the key belongs to (the page asks for a key on 401);
- ``GET /v1/console/runs``: the caller's runs, newest first, filtered by session, status, tool
  and time, each with its steps, duration and the tools it called;
- ``GET /v1/console/runs/{id}``: one run laid out per step — the five stages with their
  latency and status code, the prompt, the raw completion and the thought in it, each call
  with its arguments, result, time, cache hit and approval — with usage and cost while the
  run is in memory;
- ``GET /v1/approvals``: the caller's pending approvals, over all their runs.

The page itself and its assets need no key (they hold no data); every answer that holds data
does. Assets are sent with a Content-Security-Policy that allows scripts and styles from this
origin only, so even a slip in escaping could not run a script that a tool result carried.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from functools import cache
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict
from starlette.responses import RedirectResponse, Response

from hermes_agent.audit.records import AuditRecord
from hermes_agent.audit.trace_view import STAGES as STAGES  # the stages' order, as before
from hermes_agent.audit.trace_view import trace_summary, trace_view
from hermes_agent.events import SelectionEvent, ThoughtEvent
from hermes_agent.runs.backend import RunBackend, RunView
from hermes_agent.runs.events import (
    ApprovalRequiredEvent,
    ApprovalResolvedEvent,
    RunEvent,
    UnknownEvent,
    read_event,
)
from hermes_agent.server.auth import CurrentUser
from hermes_agent.server.routes_runs import json_response
from hermes_agent.storage.base import Storage

router = APIRouter()

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_ASSET_NAME = re.compile(r"^[a-z0-9_-]{1,64}\.(html|js|css|svg)$")
_MAX_SCAN = 2000
"""The most stored requests one list request looks through."""

RunStatusFilter = Literal[
    "running", "waiting_approval", "completed", "failed", "cancelled", "timed_out", "incomplete"
]
_ERROR_TEXT = {
    401: "No valid API key (send `Authorization: Bearer <key>`)",
    404: "No such run that belongs to the caller",
    422: "The request does not match its schema",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorAnswer, "description": _ERROR_TEXT[code]} for code in codes}


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorAnswer(_Open):
    """An error: ``detail`` says what went wrong."""

    detail: str | list[dict[str, Any]]


class ConsoleMe(_Open):
    """The caller, and how the service checks keys (``keys`` or ``none``)."""

    user_id: str
    admin: bool
    auth: str


class ConsoleRunRow(_Open):
    """One run of the list."""

    request_id: str
    session_id: str
    status: str
    created: float
    """Seconds since the epoch."""
    duration_ms: float | None
    steps: int | None
    tools: list[str]
    """The tools the model called in this run (run or refused), first call first."""
    status_code: int | None
    pending_approvals: int
    source: Literal["memory", "queue", "store"]


class ConsoleRunList(_Open):
    runs: list[ConsoleRunRow]


class StageView(_Open):
    """One of the five stages of a step; ``ran`` is false for a stage the step did not run."""

    stage: str
    ran: bool
    status_code: int | None
    latency_ms: float | None
    offset_ms: float | None
    """When the stage started, from the start of its step."""


class StepView(_Open):
    step: int
    offset_ms: float
    """When the step started, from the start of the run."""
    duration_ms: float
    stages: list[StageView]
    prompt: dict[str, str] | None
    completion: str | None
    thought: str | None
    """A thinking model's thought in this step, read from the recorded completion."""
    notes: list[str]
    """What the parser saw in the completion and did not act on (a call inside the thought)."""
    calls: list[dict[str, Any]]
    output: str | None


class ConsoleRunView(_Open):
    """A run laid out for reading (see the module docstring)."""

    request_id: str
    session_id: str
    status: str
    status_code: int | None
    """The result's own status (a failed run's 4xx/5xx), or the trail's last one."""
    source: Literal["memory", "queue", "store"]
    created: float | None
    duration_ms: float | None
    model: str | None
    user_message: str | None
    output: str | None
    error: str | None
    usage: dict[str, int] | None
    cost: float | None
    steps: list[StepView]
    pending_approvals: list[dict[str, Any]]
    warnings: list[str]


class PendingApprovalRow(_Open):
    approval_id: str
    request_id: str
    session_id: str
    tool: str
    arguments: dict[str, Any]
    created: str
    expires: str | None
    """Null for a queued run's approval (it waits until answered or cancelled)."""


class PendingApprovalList(_Open):
    approvals: list[PendingApprovalRow]


# -- the page and its assets ---------------------------------------------------------------


@cache
def _asset(name: str) -> bytes | None:
    if not _ASSET_NAME.match(name):
        return None
    found = resources.files("hermes_agent.server").joinpath("console", name)
    return found.read_bytes() if found.is_file() else None


def _asset_response(name: str) -> Response:
    body = _asset(name)
    if body is None:
        raise HTTPException(404, f"no console asset {name!r}")
    suffix = name[name.rindex(".") :]
    return Response(
        body,
        media_type=_MEDIA_TYPES[suffix],
        headers={
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )


@router.get("/", include_in_schema=False)
async def root() -> Response:
    """The console is the service's home page."""
    return RedirectResponse("/console/")


@router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> Response:
    """The console's icon, for a browser that asks at the root (the page names it too)."""
    return _asset_response("favicon.svg")


@router.get("/console", include_in_schema=False)
async def console_redirect() -> Response:
    return RedirectResponse("/console/")


@router.get("/console/", include_in_schema=False)
async def console_page() -> Response:
    """The console's single page (data comes from the API, with the caller's key)."""
    return _asset_response("index.html")


@router.get("/console/{name}", include_in_schema=False)
async def console_asset(name: str) -> Response:
    """A module or stylesheet of the console."""
    return _asset_response(name)


# -- who is calling ------------------------------------------------------------------------


@router.get("/v1/console/me", response_model=ConsoleMe, responses=_errors(401, 422))
async def me(request: Request, user: CurrentUser) -> Response:
    """The caller's user id, whether the key is an admin key, and the service's auth mode."""
    return json_response(
        {"user_id": user.user_id, "admin": user.admin, "auth": request.app.state.settings.auth}
    )


# -- the runs list -------------------------------------------------------------------------


def _storage(request: Request) -> Storage:
    storage: Storage = request.app.state.storage
    return storage


def _events(wires: list[dict[str, Any]]) -> Iterator[RunEvent]:
    """A held run's log, each event as its type (what this version cannot read is skipped)."""
    for wire in wires:
        try:
            yield read_event(wire)
        except UnknownEvent:
            continue


def _tools_of_events(wires: list[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for event in _events(wires):
        if isinstance(event, SelectionEvent):
            names.extend(c.name for c in event.planned if c.name)
            names.extend(c.name for c in event.rejected if c.name)
    return names


def _memory_row(view: RunView, wires: list[dict[str, Any]]) -> dict[str, Any]:
    result = view.result or {}
    created = view.created or 0.0
    end = view.finished if view.finished is not None else time.time()
    steps = sum(1 for event in _events(wires) if isinstance(event, ThoughtEvent))
    return {
        "request_id": view.request_id,
        "session_id": view.session_id,
        "status": view.status,
        "created": view.created,
        "duration_ms": result.get("duration_ms", round((end - created) * 1000, 3)),
        "steps": len(result["steps"]) if "steps" in result else steps,
        "tools": _distinct(_tools_of_events(wires)),
        "status_code": result.get("status"),
        "pending_approvals": len(view.pending_approvals),
        "source": "memory",
    }


def _distinct(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


@router.get("/v1/console/runs", response_model=ConsoleRunList, responses=_errors(401, 422))
async def console_runs(
    request: Request,
    user: CurrentUser,
    session_id: Annotated[str | None, Query(max_length=255)] = None,
    status: RunStatusFilter | None = None,
    tool: Annotated[str | None, Query(max_length=200)] = None,
    since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
    until: Annotated[float | None, Query(ge=0, le=1e11)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> Response:
    """The caller's runs, newest first, as the run backend lists them (in flight and recent
    ones, queued ones, older ones from the store), with what the console shows beside each:
    steps, tools, duration, status code. ``since`` and ``until`` are seconds since the epoch;
    ``tool`` keeps the runs that called that tool."""
    storage = _storage(request)
    backend: RunBackend = request.app.state.backend
    listed = await backend.runs(
        user, session_id or None, status, min(_MAX_SCAN, limit * 4 if tool else limit)
    )
    listed = [
        row
        for row in listed
        if (since is None or (row["created"] or 0.0) >= since)
        and (until is None or (row["created"] or 0.0) <= until)
    ]

    def from_store(row: dict[str, Any]) -> dict[str, Any]:
        summary = trace_summary(storage.records(row["request_id"]))
        return {
            **row,
            "duration_ms": summary.duration_ms,
            "steps": summary.steps,
            "tools": list(summary.tools),
            "status_code": summary.status_code,
            "pending_approvals": 0,
        }

    rows: list[dict[str, Any]] = []
    for row in listed:
        wires = backend.held_events(row["request_id"], user)
        if wires is not None:
            shown = _memory_row(await backend.view(row["request_id"], user), wires)
        else:
            shown = await run_in_threadpool(from_store, row)
            if row["status"] == "waiting_approval":
                view = await backend.view(row["request_id"], user)
                shown["pending_approvals"] = len(view.pending_approvals)
        if not tool or tool in shown["tools"]:
            rows.append(shown)
            if len(rows) >= limit:
                break
    return json_response({"runs": rows})


# -- one run -------------------------------------------------------------------------------


@router.get(
    "/v1/console/runs/{request_id}",
    response_model=ConsoleRunView,
    responses=_errors(404, 401, 422),
)
async def console_run(request_id: str, request: Request, user: CurrentUser) -> Response:
    """One run, per step: the five stages, the prompt, the completion, the calls."""
    storage = _storage(request)
    backend: RunBackend = request.app.state.backend
    view = await backend.view(request_id, user)  # RunNotFound: 404, whoever's it is
    wires = backend.held_events(request_id, user)
    records = await run_in_threadpool(storage.records, request_id)
    return json_response(run_view(view, records, wires))


def run_view(
    view: RunView, records: list[AuditRecord], held: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """The console's view of a run: the run backend's view of it (status, result, approvals
    waiting), its audit records per step (``audit.trace_view``), and from memory while this
    process holds it (the approvals as they were asked and answered)."""
    result = view.result
    approvals = _answered_approvals(held) if held is not None else []
    if not approvals and result:
        approvals = list(result["approvals"])
    trace = trace_view(records, approvals)
    steps = [step.to_dict() for step in trace.steps]
    if result:
        for step in steps:
            found = next((s for s in result["steps"] if s["index"] == step["step"]), None)
            if found is not None:
                step["usage"] = found["usage"]
    return {
        "request_id": view.request_id,
        "session_id": view.session_id,
        "status": view.status,
        "status_code": (result or {}).get("status", view.status_code),
        "source": view.source,
        "created": view.created if view.created is not None else trace.started,
        "duration_ms": result["duration_ms"] if result else trace.duration_ms,
        "model": trace.model,
        "system_prompt_sha256": trace.system_prompt_sha256,
        "user_message": trace.user_message,
        "output": result["output"] if result else trace.output,
        "error": view.error or (result or {}).get("error"),
        "usage": result["usage"] if result else None,
        "cost": result["cost"] if result else None,
        "steps": steps,
        "pending_approvals": view.pending_approvals,
        "approvals": approvals,
        "warnings": list(result["warnings"]) if result else [],
        "records": trace.pipeline_records,
    }


def _answered_approvals(wires: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's approvals as its events tell them: the tool and arguments that were shown,
    and the answer with the reason the person gave."""
    asked: dict[str, ApprovalRequiredEvent] = {}
    answered: list[dict[str, Any]] = []
    for event in _events(wires):
        if isinstance(event, ApprovalRequiredEvent):
            asked[event.approval_id] = event
        elif isinstance(event, ApprovalResolvedEvent) and event.approval_id in asked:
            shown = asked[event.approval_id]
            answered.append(
                {
                    "tool": shown.tool,
                    "arguments": shown.arguments,
                    "approved": event.approved,
                    "reason": event.reason,
                }
            )
    return answered


# -- approvals -----------------------------------------------------------------------------


@router.get("/v1/approvals", response_model=PendingApprovalList, responses=_errors(401, 422))
async def pending_approvals(request: Request, user: CurrentUser) -> Response:
    """The caller's approvals waiting for an answer, oldest first, over all their runs."""
    backend: RunBackend = request.app.state.backend
    return json_response({"approvals": await backend.approvals(user)})
