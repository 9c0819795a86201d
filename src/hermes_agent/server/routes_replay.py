"""``POST /v1/runs/{request_id}/replay``: run a recorded request again, with the model's
recorded answers, against the service's agent as it is now (its tools, schemas, hooks and
prompts), and compare step by step (``hermes_agent.replay``; the CLI's ``hermes-agent replay``).

A replay is a run of its owner's: it passes the run layer's gate (runs in flight, the daily
quota: it counts as one run; its model is the recording, so it spends no tokens) and leaves a
trail of its own in the store — its request id is ``replay_request_id`` in the answer, in the
owner's session ``replay-<request id>``, readable like any run. By default it runs only the tools
declared ``idempotent``; a call of any other is answered "not run in this replay" (403) and
listed in ``skipped_calls`` — ask for ``?execute_tools=true`` to run today's tools for real (a
tool that changed then shows as a difference). It never reuses an approval: an approval answers
one call once, so a call that needs approval is refused in the replay (403, and the step shows
as differing). At most ``MAX_CONCURRENT_REPLAYS`` run at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from hermes_agent.agent import Agent
from hermes_agent.errors import HermesAgentError
from hermes_agent.models.base import Model
from hermes_agent.replay import ReplayReport, replay
from hermes_agent.runs.backend import RunBackend, RunNotFound, RunView
from hermes_agent.runs.gate import RunRejected
from hermes_agent.runs.principal import Principal, client_session_id, stored_session_id
from hermes_agent.runs.request import RunRequest
from hermes_agent.runs.status import FINAL_STATUSES
from hermes_agent.server.auth import CurrentUser
from hermes_agent.server.routes_console import ErrorAnswer
from hermes_agent.server.routes_runs import json_response
from hermes_agent.storage.base import Storage, StorageError
from hermes_agent.tools.registry import Tool
from hermes_agent.types import ToolCall

router = APIRouter()

MAX_CONCURRENT_REPLAYS = 2
NOT_REUSED = (
    "a replay does not reuse the recorded approval (an approval answers one call, once); "
    "ask again with a new run"
)


class ReplayAnswer(BaseModel):
    """``ReplayReport`` as JSON: ``matched``, the first differing step, and per step the
    calls, results and output recorded and replayed, with what differs."""

    model_config = ConfigDict(extra="allow")

    request_id: str
    matched: bool
    first_difference: int | None
    steps: list[dict[str, Any]]
    expected_output: str
    actual_output: str
    history_messages: int
    notes: list[str]


_DOCUMENTED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorAnswer, "description": "No valid API key"},
    404: {"model": ErrorAnswer, "description": "No recorded run of that id belongs to the caller"},
    409: {"model": ErrorAnswer, "description": "The run is still in flight"},
    422: {"model": ErrorAnswer, "description": "The request or the recording cannot be replayed"},
}


class _FreshApprovalsOnly:
    """The served agent, forked for a replay with an approver that refuses every call that
    needs approval (``hermes_agent.replay.Replayable``)."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def fork(
        self, *, model: Model, storage: Storage, approver: Callable[[ToolCall, Tool], Any]
    ) -> Agent:
        return self._agent.fork(model=model, storage=storage, approver=_refuse)


def _refuse(_call: ToolCall, _tool: Tool) -> tuple[bool, str]:
    return False, NOT_REUSED


def report_to_dict(report: ReplayReport) -> dict[str, Any]:
    """The report as JSON (the replay run's own result reduced to what a reader needs)."""
    data = dataclasses.asdict(dataclasses.replace(report, result=None, records=[]))
    del data["records"]
    result = report.result
    data["result"] = (
        None
        if result is None
        else {
            "output": result.output,
            "status": result.status,
            "duration_ms": result.duration_ms,
            "tool_calls": [
                {"name": c.name, "arguments": c.arguments, "status_code": c.status_code}
                for c in result.tool_calls
            ],
        }
    )
    return data


@router.post("/v1/runs/{request_id}/replay", response_model=ReplayAnswer, responses=_DOCUMENTED)
async def replay_run(
    request_id: str, request: Request, user: CurrentUser, execute_tools: bool = False
) -> Response:
    """Replay a finished run against today's agent and compare step by step (a run of the
    caller's: admitted, counted and recorded)."""
    backend: RunBackend = request.app.state.backend
    storage: Storage = request.app.state.storage
    agent: Agent = request.app.state.agent
    view = await _caller_view(backend, request_id, user)
    if view is not None and view.status not in FINAL_STATUSES:
        raise HTTPException(409, f"run {request_id!r} is still in flight; replay it once it ends")
    records = await run_in_threadpool(storage.records, request_id)
    if not records or (
        view is None
        and client_session_id(user.user_id, records[0].session_id) is None
        and not user.admin
    ):
        raise HTTPException(404, f"no recorded run {request_id!r}")
    limiter: anyio.CapacityLimiter | None = getattr(request.app.state, "replay_limiter", None)
    if limiter is None:
        limiter = anyio.CapacityLimiter(MAX_CONCURRENT_REPLAYS)
        request.app.state.replay_limiter = limiter
    # A replay is a run of its owner's: the same gate, counted in flight (with the queue's
    # runs in queue mode) and against the day's runs.
    who = RunRequest(message=f"replay {request_id}", session_id=f"replay-{request_id}")

    def run_replay() -> ReplayReport:
        return replay(_FreshApprovalsOnly(agent), request_id, storage, execute_tools=execute_tools)

    try:
        # Its model is the recording: it counts as a run, and spends no tokens.
        async with backend.admitted(user, who, f"replay-{request_id}"):
            report = await anyio.to_thread.run_sync(run_replay, limiter=limiter)
    except StorageError as exc:
        raise HTTPException(422, str(exc)) from None
    except RunRejected:
        raise  # the gate's own answer (429, 503, ...): the app's handler writes it
    except HermesAgentError as exc:
        raise HTTPException(422, f"the replay failed: {exc}") from None
    answer = report_to_dict(report)
    answer["replay_request_id"] = await run_in_threadpool(
        _keep_trail, agent, report, stored_session_id(user.user_id, f"replay-{request_id}")
    )
    answer["executed_tools"] = execute_tools
    return json_response(answer)


def _keep_trail(agent: Agent, report: ReplayReport, session_id: str) -> str | None:
    """Store the replay run's own trail under the owner's session; its request id."""
    sink = agent.audit_sink
    if sink is None or not report.records:
        return None
    kept = [dataclasses.replace(record, session_id=session_id) for record in report.records]
    sink.write(kept)
    sink.flush()
    return kept[0].request_id


async def _caller_view(backend: RunBackend, request_id: str, user: Principal) -> RunView | None:
    """The run as the run backend knows it, if it is the caller's (``None`` otherwise, or
    when only its trail is left)."""
    try:
        return await backend.view(request_id, user)
    except RunNotFound:
        return None
