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

import json
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

from hermes_agent.audit.records import AuditRecord, Role
from hermes_agent.events import SelectionEvent, ThoughtEvent
from hermes_agent.protocol.parser import parse_completion
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
from hermes_agent.server.runs import Run, RunManager
from hermes_agent.stages import StageName
from hermes_agent.storage.base import Storage
from hermes_agent.types import ToolCall

router = APIRouter()

STAGES = tuple(StageName)
"""The five stages, in the order a step runs them."""

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


def _manager(request: Request) -> RunManager:
    manager: RunManager = request.app.state.manager
    return manager


def _storage(request: Request) -> Storage:
    storage: Storage = request.app.state.storage
    return storage


def _events(run: Run) -> Iterator[RunEvent]:
    """The run's log, each event as its type (what this version cannot read is skipped)."""
    for _, wire in run.events:
        try:
            yield read_event(wire)
        except UnknownEvent:
            continue


def _tools_of_events(run: Run) -> list[str]:
    names: list[str] = []
    for event in _events(run):
        if isinstance(event, SelectionEvent):
            names.extend(c.name for c in event.planned if c.name)
            names.extend(c.name for c in event.rejected if c.name)
    return names


def _tools_of_records(records: Iterable[AuditRecord]) -> list[str]:
    names: list[str] = []
    for record in records:
        if record.role == Role.SELECTION:
            planned, rejected = _selection(record.content)
            names.extend(str(c.get("name")) for c in planned + rejected if c.get("name"))
    return names


def _memory_row(run: Run, manager: RunManager) -> dict[str, Any]:
    result = run.result or {}
    end = run.finished if run.finished is not None else time.time()
    steps = sum(1 for event in _events(run) if isinstance(event, ThoughtEvent))
    return {
        "request_id": run.id,
        "session_id": run.session_id,
        "status": run.status,
        "created": run.created,
        "duration_ms": result.get("duration_ms", round((end - run.created) * 1000, 3)),
        "steps": len(result["steps"]) if "steps" in result else steps,
        "tools": _distinct(_tools_of_events(run)),
        "status_code": result.get("status"),
        "pending_approvals": len(manager.pending(run)),
        "source": "memory",
    }


def _distinct(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


_FINAL_ROLES = frozenset({Role.OUTPUT, Role.STOPPED})
"""The roles of a trail's last record: its answer, or how it stopped."""


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
    manager, storage = _manager(request), _storage(request)
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
        records = storage.records(row["request_id"])
        times = [r.timestamp_ns for r in records]
        final = next((r for r in reversed(records) if r.role in _FINAL_ROLES), None)
        return {
            **row,
            "duration_ms": round((max(times) - min(times)) / 1e6, 3) if times else None,
            "steps": sum(1 for r in records if r.role == Role.COMPLETION),
            "tools": _distinct(_tools_of_records(records)),
            "status_code": final.status_code if final is not None else None,
            "pending_approvals": 0,
        }

    rows: list[dict[str, Any]] = []
    for row in listed:
        run = manager.get(row["request_id"], user.user_id)
        if run is not None:
            shown = _memory_row(run, manager)
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
    manager, storage = _manager(request), _storage(request)
    backend: RunBackend = request.app.state.backend
    view = await backend.view(request_id, user)  # RunNotFound: 404, whoever's it is
    run = manager.get(request_id, user.user_id, admin=user.admin)
    records = await run_in_threadpool(storage.records, request_id)
    return json_response(run_view(view, records, run))


def run_view(view: RunView, records: list[AuditRecord], run: Run | None) -> dict[str, Any]:
    """The console's view of a run: the run backend's view of it (status, result, approvals
    waiting), its audit records per step, and from memory while this process holds it (the
    approvals as they were asked and answered)."""
    request_id, pending = view.request_id, view.pending_approvals
    result = view.result
    # The service's own record that it accepted the run comes before the pipeline's; the
    # steps, the model and the prompt's hash are the pipeline's records.
    records = [r for r in records if r.role != Role.ACCEPTED]
    approvals = _answered_approvals(run) if run is not None else []
    if not approvals and result:
        approvals = list(result["approvals"])
    unmatched = list(approvals)  # each answer goes to one call
    origin = min((_started_ns(r) for r in records), default=0)
    steps = [
        _step_view(step, [r for r in records if r.step == step], origin, unmatched)
        for step in sorted({r.step for r in records})
    ]
    if result:
        for step in steps:
            found = next((s for s in result["steps"] if s["index"] == step["step"]), None)
            if found is not None:
                step["usage"] = found["usage"]
    first = records[0] if records else None
    output = next((r for r in reversed(records) if r.role == Role.OUTPUT), None)
    user_message = next((r.content for r in records if r.role == Role.USER), None)
    created = (
        view.created
        if view.created is not None
        else (_started_ns(first) / 1e9 if first is not None else None)
    )
    duration = (
        result["duration_ms"]
        if result
        else (round((max(r.timestamp_ns for r in records) - origin) / 1e6, 3) if records else None)
    )
    return {
        "request_id": request_id,
        "session_id": view.session_id,
        "status": view.status,
        "status_code": (result or {}).get("status", view.status_code),
        "source": view.source,
        "created": created,
        "duration_ms": duration,
        "model": first.model_name if first else None,
        "system_prompt_sha256": first.system_prompt_sha256 if first else None,
        "user_message": user_message,
        "output": result["output"] if result else (output.content if output else None),
        "error": view.error or (result or {}).get("error"),
        "usage": result["usage"] if result else None,
        "cost": result["cost"] if result else None,
        "steps": steps,
        "pending_approvals": pending,
        "approvals": approvals,
        "warnings": list(result["warnings"]) if result else [],
        "records": len(records),
    }


def _answered_approvals(run: Run) -> list[dict[str, Any]]:
    """The run's approvals as its events tell them: the tool and arguments that were shown,
    and the answer with the reason the person gave."""
    asked: dict[str, ApprovalRequiredEvent] = {}
    answered: list[dict[str, Any]] = []
    for event in _events(run):
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


def _started_ns(record: AuditRecord) -> int:
    return record.timestamp_ns - int(record.latency_ms * 1e6)


def _step_view(
    step: int, records: list[AuditRecord], origin: int, approvals: list[dict[str, Any]]
) -> dict[str, Any]:
    start = min(_started_ns(r) for r in records)
    end = max(r.timestamp_ns for r in records)
    stages = []
    for name in STAGES:
        mine = [r for r in records if r.stage == name]
        if not mine:
            stages.append(
                {
                    "stage": name,
                    "ran": False,
                    "status_code": None,
                    "latency_ms": None,
                    "offset_ms": None,
                }
            )
            continue
        worst = max(mine, key=lambda r: r.status_code)
        stages.append(
            {
                "stage": name,
                "ran": True,
                "status_code": worst.status_code,
                "latency_ms": max(r.latency_ms for r in mine),
                "offset_ms": round((min(_started_ns(r) for r in mine) - start) / 1e6, 3),
            }
        )
    by_role = {r.role: r for r in records}
    prompt = by_role.get(Role.PROMPT) or by_role.get(Role.PROMPT_ADDED)
    completion = by_role.get(Role.COMPLETION)
    # Read once: the thought, its notes and the calls the model wrote all come from here.
    parsed = parse_completion(completion.content) if completion is not None else None
    output = by_role.get(Role.OUTPUT)
    summary = None
    if Role.SUMMARY_PROMPT in by_role:
        summary = {
            "prompt": by_role[Role.SUMMARY_PROMPT].content,
            "completion": by_role[Role.SUMMARY].content if Role.SUMMARY in by_role else "",
        }
    return {
        "step": step,
        "offset_ms": round((start - origin) / 1e6, 3),
        "duration_ms": round((end - start) / 1e6, 3),
        "stages": stages,
        "prompt": {"kind": prompt.role, "text": prompt.content} if prompt else None,
        "completion": completion.content if completion else None,
        "thought": parsed.thought if parsed else None,
        "notes": list(parsed.notes) if parsed else [],
        "summary": summary,
        "calls": _calls(by_role, parsed.tool_calls if parsed else [], approvals),
        "output": output.content if output else None,
    }


_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)


def _calls(
    by_role: dict[str, AuditRecord], written: list[ToolCall], approvals: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each call of a step: what the selector decided, what the executor ran and returned
    (``written``: the calls the model wrote, as parsed from its completion)."""
    planned, rejected = (
        _selection(by_role[Role.SELECTION].content) if Role.SELECTION in by_role else ([], [])
    )
    ran = _json_list(by_role[Role.TOOL_CALLS].content) if Role.TOOL_CALLS in by_role else []
    blocks = _RESPONSE.findall(by_role[Role.TOOL].content) if Role.TOOL in by_role else []
    calls: list[dict[str, Any]] = []
    if not ran:  # selected but not run (a dry run, a run stopped before the executor)
        for item in planned:
            calls.append(_call(item["name"], item.get("arguments"), None, None, approvals))
        for item in rejected:
            calls.append(_refused(item, None, approvals))
        return calls
    planned_left, rejected_left = list(planned), list(rejected)
    for position, entry in enumerate(ran):
        block = _json_object(blocks[position]) if position < len(blocks) else {}
        head = rejected_left[0] if rejected_left else None
        if (
            head is not None
            and head.get("name") == entry.get("name")
            and head.get("status") == entry.get("status")
        ):
            rejected_left.pop(0)
            model_args = written[position].arguments if position < len(written) else None
            calls.append(_refused(head, model_args, approvals, entry, block))
            continue
        arguments = planned_left.pop(0).get("arguments") if planned_left else None
        if arguments is None and position < len(written):
            arguments = written[position].arguments
        calls.append(_call(str(entry.get("name")), arguments, entry, block, approvals))
    return calls


def _call(
    name: str,
    arguments: Any,
    entry: dict[str, Any] | None,
    block: dict[str, Any] | None,
    approvals: list[dict[str, Any]],
) -> dict[str, Any]:
    metadata = dict((entry or {}).get("metadata") or {})
    content = (block or {}).get("content")
    envelope = content if isinstance(content, dict) and "status" in content else None
    return {
        "id": (entry or {}).get("id"),
        "name": name,
        "arguments": arguments,
        "status_code": (entry or {}).get("status"),
        "ran": entry is not None,
        "refused": False,
        "result": envelope.get("data") if envelope else content,
        "error": envelope.get("error") if envelope else None,
        "execution_time_ms": metadata.pop("execution_time_ms", None),
        "cache_hit": metadata.pop("cache_hit", None),
        "metadata": {k: v for k, v in metadata.items() if k != "tool_name"},
        "approval": _approval_for(name, arguments, approvals),
    }


def _refused(
    item: dict[str, Any],
    arguments: Any,
    approvals: list[dict[str, Any]],
    entry: dict[str, Any] | None = None,
    block: dict[str, Any] | None = None,
) -> dict[str, Any]:
    name = str(item.get("name"))
    view = _call(name, arguments, entry, block, approvals)
    view.update(refused=True, ran=False, status_code=item.get("status"), error=item.get("error"))
    if (
        view["approval"] is None
        and item.get("status") == 403
        and "approval" in str(item.get("error"))
    ):
        view["approval"] = {"approved": False, "reason": item.get("error")}
    return view


def _approval_for(
    name: str, arguments: Any, approvals: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The recorded answer for this call (consumed, so two equal calls get one answer each)."""
    key = _canonical(arguments)
    for index, answer in enumerate(approvals):
        if answer.get("tool") == name and _canonical(answer.get("arguments")) == key:
            del approvals[index]
            return {"approved": answer.get("approved"), "reason": answer.get("reason")}
    return None


def _selection(content: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    data = _json_object(content)
    planned, rejected = data.get("planned", []), data.get("rejected", [])
    return (
        [p for p in planned if isinstance(p, dict)] if isinstance(planned, list) else [],
        [r for r in rejected if isinstance(r, dict)] if isinstance(rejected, list) else [],
    )


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _json_list(text: str) -> list[dict[str, Any]]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return []
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


# -- approvals -----------------------------------------------------------------------------


@router.get("/v1/approvals", response_model=PendingApprovalList, responses=_errors(401, 422))
async def pending_approvals(request: Request, user: CurrentUser) -> Response:
    """The caller's approvals waiting for an answer, oldest first, over all their runs."""
    backend: RunBackend = request.app.state.backend
    return json_response({"approvals": await backend.approvals(user)})
