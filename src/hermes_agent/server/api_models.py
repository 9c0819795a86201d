"""What the HTTP API answers, as the OpenAPI schema (``/openapi.json``) documents it.

The endpoints build their JSON themselves (``routes_runs.json_response``); these models only
describe it, so that a client generated from the schema, and the schema tests that check every
answer against it, see the real shapes: every status code an endpoint can answer, and the
body of each. Objects allow extra fields (a later version may add some), never fewer.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ValidationIssue(_Open):
    """One problem with a request, as FastAPI reports it."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(_Open):
    """Every error: ``detail`` says what went wrong and what to do (a list of issues for a
    request that does not match its schema)."""

    detail: str | list[ValidationIssue]


class UsageBody(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class RunResultBody(_Open):
    """A finished run (``RunResult.to_dict()``)."""

    output: str
    status: int
    request_id: str
    session_id: str
    tool_calls: list[dict[str, Any]]
    usage: UsageBody
    steps: list[dict[str, Any]]
    duration_ms: float
    error: str | None
    loop_status: str
    approvals: list[dict[str, Any]]
    rendered: Any = None
    cost: float | None = None
    warnings: list[str]


class PendingApprovalBody(_Open):
    """A tool call waiting for ``POST /v1/approvals/{approval_id}``."""

    approval_id: str
    request_id: str
    tool: str
    arguments: dict[str, Any]
    created: str
    expires: str


class QueuedBody(_Open):
    """A run accepted and not waited for — put on the queue (``execution: queue``, source
    ``queue``) or started with ``Prefer: respond-async`` (in process: ``memory``): where to
    follow it."""

    request_id: str
    session_id: str
    status: str
    status_url: str
    events_url: str
    source: Literal["queue", "memory"]


class QueuedApprovalBody(_Open):
    """A queued run's tool call waiting for ``POST /v1/approvals/{approval_id}`` (it waits
    until answered or cancelled: ``expires`` is null)."""

    approval_id: str
    request_id: str
    tool: str
    arguments: dict[str, Any]
    created: str
    expires: str | None


class RunBody(_Open):
    """A run, the one shape every door and both engines show (``runs.backend.RunView``):
    fields an engine does not know are null. ``source``: ``memory`` (this process runs it or
    ran it lately), ``queue`` (the workers' store) or ``store`` (only its audit trail)."""

    request_id: str
    session_id: str
    status: str
    """``queued``, ``running``, ``waiting_approval``, ``completed``, ``failed``,
    ``cancelled``, ``timed_out``, ``dead``, ``interrupted`` — or ``incomplete`` for a trail
    cut short."""
    source: Literal["memory", "queue", "store"]
    created: float | None
    """Seconds since the epoch."""
    finished: float | None
    result: RunResultBody | None
    error: str | None
    pending_approvals: list[QueuedApprovalBody]
    events: int | None
    """Events in this process's log (in memory)."""
    attempts: int | None
    """How many times a worker took the run (queued; a resume after an approval is one more)."""
    redeliveries: int | None
    worker: str | None
    """The worker holding the run now (queued)."""
    status_code: int | None
    """The status code of the trail's last record (read from the store)."""
    output: str | None
    records: int | None


class RunListItem(_Open):
    request_id: str
    session_id: str
    status: str
    created: float | None
    """Seconds since the epoch."""
    source: Literal["memory", "store", "queue"]


class RunListBody(_Open):
    runs: list[RunListItem]


class CancelBody(_Open):
    request_id: str
    cancelled: bool
    """``False`` when the run was over already, or ended on its own while the cancel waited
    (it was saving its turn: ``status`` says how it ended)."""
    status: str
    still_running: list[dict[str, Any]] | None = None
    """Only when there are any: the calls the cancel could not stop (``name``, ``call_id``,
    ``step``); each one's result is written to the trail as ``late_result`` when it ends."""


class ApprovalAnsweredBody(_Open):
    approval_id: str
    approved: bool
    reason: str


class SessionRow(_Open):
    id: str
    created: str
    updated: str
    turns: int
    messages: int


class SessionListBody(_Open):
    sessions: list[SessionRow]


class SessionBody(_Open):
    id: str
    messages: list[dict[str, Any]]
    runs: list[str]


class TraceRecord(_Open):
    request_id: str
    session_id: str
    step: int
    stage: str
    status_code: int


class TraceBody(_Open):
    request_id: str
    records: list[TraceRecord]


class StatusBody(_Open):
    status: str
    error: str | None = None


RUN_HEADERS: dict[str, Any] = {
    "X-Run-Id": {"description": "The run's id", "schema": {"type": "string"}},
    "Location": {
        "description": "`/v1/runs/{id}`: where to look the run up",
        "schema": {"type": "string"},
    },
}
"""The headers of every answer for a run that was started."""

_DESCRIPTIONS = {
    400: "The body is not valid JSON (`detail` says so; the same answer on every endpoint)",
    401: "No valid API key (send `Authorization: Bearer <key>`)",
    404: "No such thing that belongs to the caller",
    409: "Answered already, or the run was cancelled",
    413: "The body or the message is larger than the service accepts",
    422: "The request does not match its schema, or the agent refuses it",
    429: "Over a limit (runs in flight, a daily quota): retry after `Retry-After` seconds",
    503: "The service is shutting down, or a store it needs cannot be reached",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for the error answers ``codes``."""
    documented: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {"model": ErrorBody, "description": _DESCRIPTIONS[code]}
        if code == 429:
            entry["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait before trying again",
                    "schema": {"type": "integer"},
                }
            }
        documented[code] = entry
    return documented


AUTHENTICATED = (401, 422)
"""What every endpoint behind a key can answer besides its own."""

EVENT_STREAM: dict[str, Any] = {
    "text/event-stream": {
        "itemSchema": {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "id": {"type": "string", "pattern": "^[0-9]+$"},
                "event": {"type": "string"},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"type": "object", "required": ["kind"]},
                },
            },
        },
        "example": 'id: 1\nevent: input\ndata: {"kind": "input", ...}\n\n',
    }
}
"""An event stream: ``id: <n>`` / ``event: <kind>`` / ``data: <json>`` frames (a queued run's
last event, when the service makes it from the run's row, has no ``id``: it is not in the
store's log)."""
