"""The AG-UI door: ``POST /v1/agui`` takes an AG-UI ``RunAgentInput`` and streams the run as
AG-UI events over SSE (the ``ag-ui-protocol`` package's models and encoder).

Like every door it only translates: the input becomes a ``RunRequest`` (the thread is the
caller's session, the last user message the run's message) and goes through the run layer's
one seam (``RunBackend``), so keys, ownership, narrowing, budgets and quotas are the gate's,
in process or queued alike. The run's typed events become AG-UI's:

=====================================  ==================================================
the run                                AG-UI
=====================================  ==================================================
started                                ``RUN_STARTED`` (the run's id in ``metadata``)
``text_delta`` / the answer            ``TEXT_MESSAGE_START`` / ``_CONTENT`` / ``_END``
``selection`` (planned calls)          ``TOOL_CALL_START`` / ``_ARGS`` / ``_END``
``tool_results``                       ``TOOL_CALL_RESULT``
``approval_required``                  ``RUN_FINISHED`` with an ``interrupt`` outcome
``result`` (status < 400)              ``RUN_FINISHED`` (``result``: the output)
``result`` (status >= 400), stopped    ``RUN_ERROR`` (``code``: the status)
cancelled                              ``RUN_FINISHED`` with a ``cancelled`` outcome
=====================================  ==================================================

An approval ends the AG-UI run with an interrupt (AG-UI 1.0's own way to pause for a human):
the Hermes run keeps waiting, and a new ``RunAgentInput`` whose ``resume`` answers the
interrupt (``status: resolved``, ``payload: {"approved": true}``) answers the approval and
streams the rest of the same run.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from ag_ui.core import (
    BaseEvent,
    Interrupt,
    ResumeEntry,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)
from ag_ui.encoder import EventEncoder
from fastapi import APIRouter, HTTPException, Request
from starlette.responses import Response

from hermes_agent.runs.backend import Item, RunBackend, RunNotFound
from hermes_agent.runs.events import (
    ApprovalRequiredEvent,
    RunStoppedEvent,
    StoredResultEvent,
    read_known,
)
from hermes_agent.runs.principal import Principal
from hermes_agent.runs.request import RunRequest
from hermes_agent.runs.settings import ServiceSettings
from hermes_agent.server.api_models import errors
from hermes_agent.server.auth import CurrentUser
from hermes_agent.server.routes_runs import run_headers
from hermes_agent.server.sse import EventStreamResponse

router = APIRouter(prefix="/v1")

AGUI_STREAM: dict[str, Any] = {
    "text/event-stream": {
        "itemSchema": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"type": "object", "required": ["type"]},
                },
            },
        },
        "example": 'data: {"type":"RUN_STARTED","threadId":"t1","runId":"r1"}\n\n',
    }
}
"""AG-UI's SSE framing: ``data: <event JSON>`` frames (the ``ag-ui-protocol`` encoder's)."""

APPROVAL_REASON = "tool_approval"
"""The ``reason`` of the interrupt an approval becomes."""


def _text(message: UserMessage) -> str:
    """A user message's text (its text parts, joined; other parts are not read)."""
    if isinstance(message.content, str):
        return message.content
    return "".join(str(getattr(part, "text", "")) for part in message.content)


def run_request(body: RunAgentInput) -> RunRequest:
    """The run an AG-UI input asks for: the thread is the caller's session (the service keeps
    its history, so only the last message is new), and that last message must be the user's.
    Client-side tools are not taken here (422): the agent's own tools serve the run."""
    if body.tools:
        raise HTTPException(422, "client-side tools are not supported on the AG-UI door")
    last = body.messages[-1] if body.messages else None
    if not isinstance(last, UserMessage) or not _text(last).strip():
        raise HTTPException(422, "the last message must be a user message with text")
    return RunRequest(message=_text(last), session_id=body.thread_id, stream=True)


class Translation:
    """The run's wire events as AG-UI events, in order. Tool call ids are the run's id, the
    selection's number and the call's place in it, so that following a run again from its
    start names every call as before (what a resumed stream relies on)."""

    def __init__(self, thread_id: str, run_id: str, request_id: str) -> None:
        self.thread_id, self.run_id, self.request_id = thread_id, run_id, request_id
        self.message_id: str | None = None
        self.messages = 0
        self.selections = 0
        self.waiting: list[tuple[str, str]] = []
        """Calls announced and not yet answered: (name, tool call id), in order."""
        self.approvals: list[tuple[str, Any, str]] = []
        """Calls shown for an approval and not yet selected: (name, arguments, id)."""
        self.call_ids: dict[str, str] = {}
        """The tool call id of each approval's call, by approval id."""

    def _announce(self, call_id: str, name: str, arguments: Any) -> list[BaseEvent]:
        return [
            ToolCallStartEvent(tool_call_id=call_id, tool_call_name=name),
            ToolCallArgsEvent(
                tool_call_id=call_id, delta=json.dumps(arguments, ensure_ascii=False, default=str)
            ),
            ToolCallEndEvent(tool_call_id=call_id),
        ]

    def _announced(self, name: str, arguments: Any) -> str | None:
        """The id a call was shown under for its approval (then forgotten), or ``None``."""
        for index, (shown, shown_arguments, call_id) in enumerate(self.approvals):
            if shown == name and shown_arguments == arguments:
                del self.approvals[index]
                return call_id
        return None

    def _close_text(self) -> list[BaseEvent]:
        if self.message_id is None:
            return []
        closed, self.message_id = self.message_id, None
        return [TextMessageEndEvent(message_id=closed)]

    def _text(self, text: str) -> list[BaseEvent]:
        if not text:
            return []
        events: list[BaseEvent] = []
        if self.message_id is None:
            self.messages += 1
            self.message_id = f"{self.request_id}:m{self.messages}"
            events.append(TextMessageStartEvent(message_id=self.message_id, role="assistant"))
        events.append(TextMessageContentEvent(message_id=self.message_id, delta=text))
        return events

    def event(self, wire: dict[str, Any]) -> tuple[list[BaseEvent], ApprovalRequiredEvent | None]:
        """The AG-UI events for one of the run's; an approval is given back to the caller,
        which ends the AG-UI run with an interrupt."""
        kind = wire.get("kind")
        if kind == "text_delta":
            return self._text(str(wire.get("text") or "")), None
        if kind == "selection":
            self.selections += 1
            events = self._close_text()
            for index, call in enumerate(wire.get("planned") or []):
                name, arguments = str(call.get("name")), call.get("arguments") or {}
                call_id = self._announced(name, arguments)
                if call_id is None:  # not shown yet for an approval
                    call_id = f"{self.request_id}:c{self.selections}.{index}"
                    events += self._announce(call_id, name, arguments)
                self.waiting.append((name, call_id))
            for refused in wire.get("rejected") or []:
                # A call shown for its approval and then denied: its answer is the refusal.
                name = str(refused.get("name"))
                shown = next((c for c in self.approvals if c[0] == name), None)
                if shown is not None:
                    self.approvals.remove(shown)
                    events.append(self._result(shown[2], refused))
            return events, None
        if kind == "tool_results":
            return self._results(wire.get("results") or []), None
        event = read_known(wire)
        if isinstance(event, ApprovalRequiredEvent):
            # The approval is asked before the selection is told: the call is shown now, and
            # the selection that lets it through names it by the same id.
            call_id = f"{self.request_id}:a{event.approval_id}"
            self.approvals.append((event.tool, event.arguments, call_id))
            self.call_ids[event.approval_id] = call_id
            return [
                *self._close_text(),
                *self._announce(call_id, event.tool, event.arguments),
            ], event
        if isinstance(event, StoredResultEvent):
            return self._ended(event.result), None
        if isinstance(event, RunStoppedEvent):
            return self._stopped(event.status, event.error), None
        return [], None

    def _results(self, results: list[dict[str, Any]]) -> list[BaseEvent]:
        events: list[BaseEvent] = []
        for outcome in results:
            name = str(outcome.get("name"))
            match = next((i for i, (n, _) in enumerate(self.waiting) if n == name), None)
            if match is None:
                continue  # a refused call: never announced, the model reads why
            _, call_id = self.waiting.pop(match)
            events.append(self._result(call_id, outcome))
        return events

    @staticmethod
    def _result(call_id: str, outcome: dict[str, Any]) -> ToolCallResultEvent:
        """A call's answer: its content as the model reads it, or why it was refused."""
        content = outcome.get("content", outcome.get("error"))
        text = content if isinstance(content, str) else json.dumps(content, default=str)
        return ToolCallResultEvent(
            message_id=f"{call_id}:result", tool_call_id=call_id, content=text, role="tool"
        )

    def _ended(self, result: dict[str, Any]) -> list[BaseEvent]:
        status = int(result.get("status") or 500)
        output = str(result.get("output") or "")
        # Nothing streamed (a buffered model, an answer from a hook): the answer as one message.
        events = self._text(output) if self.messages == 0 else []
        events += self._close_text()
        if status >= 400:
            message = str(result.get("error") or output or f"the run failed ({status})")
            return [*events, RunErrorEvent(message=message, code=str(status))]
        finished = RunFinishedEvent(
            thread_id=self.thread_id, run_id=self.run_id, result={"output": output}
        )
        return [*events, finished]

    def _stopped(self, status: str, error: str | None) -> list[BaseEvent]:
        events = self._close_text()
        if status == "cancelled":
            outcome = RunFinishedCancelledOutcome()
            return [
                *events,
                RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome),
            ]
        return [*events, RunErrorEvent(message=error or f"the run {status}", code=status)]

    def interrupted(self, pending: list[dict[str, Any]]) -> BaseEvent:
        """``RUN_FINISHED`` pausing for the run's pending approvals."""
        interrupts = [
            Interrupt(
                id=str(p["approval_id"]),
                reason=APPROVAL_REASON,
                message=f"Allow {p['tool']} with {json.dumps(p.get('arguments'), default=str)}?",
                tool_call_id=self.call_ids.get(str(p["approval_id"])),
                response_schema=APPROVAL_SCHEMA,
                expires_at=p.get("expires"),
                metadata={"tool": p["tool"], "arguments": p.get("arguments")},
            )
            for p in pending
        ]
        return RunFinishedEvent(
            thread_id=self.thread_id,
            run_id=self.run_id,
            outcome=RunFinishedInterruptOutcome(interrupts=interrupts),
        )


APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
}
"""What an approval's interrupt expects as the ``payload`` of its resume entry."""


async def _agui_frames(
    backend: RunBackend,
    principal: Principal,
    translation: Translation,
    items: AsyncGenerator[Item, None],
    *,
    quiet_until: set[str] | None = None,
) -> AsyncIterator[str]:
    """The AG-UI stream of one run: ``RUN_STARTED``, the run's events translated, one last
    ``RUN_FINISHED`` or ``RUN_ERROR``. With ``quiet_until`` (a resume) the events up to the
    last of those approvals are read (to name the calls as before) and not sent."""
    encoder = EventEncoder()
    started = RunStartedEvent(
        thread_id=translation.thread_id,
        run_id=translation.run_id,
        metadata={"request_id": translation.request_id},
    )
    yield encoder.encode(started)
    quiet = set(quiet_until or ())
    async with aclosing(items) as following:
        async for item in following:
            if item is None:
                yield ": keep-alive\n\n"
                continue
            events, approval = translation.event(item[1])
            if quiet:
                if approval is not None:
                    quiet.discard(approval.approval_id)
                continue
            for event in events:
                yield encoder.encode(event)
                if isinstance(event, RunFinishedEvent | RunErrorEvent):
                    return
            if approval is not None:
                view = await backend.view(translation.request_id, principal)
                pending = view.pending_approvals or [approval.to_dict()]
                yield encoder.encode(translation.interrupted(pending))
                return  # the run waits; a resume continues it


async def _resume(
    backend: RunBackend, principal: Principal, entries: list[ResumeEntry]
) -> tuple[str, set[str]]:
    """Answer the approvals a resume names (the caller's own, of one run; another's is 404
    like everywhere); the run to follow and the approvals answered."""
    mine = {str(p["approval_id"]): p for p in await backend.approvals(principal)}
    runs: set[str] = set()
    for entry in entries:
        pending = mine.get(entry.interrupt_id)
        if pending is None:
            raise RunNotFound(f"no pending approval {entry.interrupt_id!r}")
        runs.add(str(pending["request_id"]))
    if len(runs) != 1:
        raise HTTPException(422, "a resume answers the interrupts of one run")
    for entry in entries:
        payload = entry.payload if isinstance(entry.payload, dict) else {}
        approved = entry.status == "resolved" and payload.get("approved") is True
        reason = str(payload.get("reason") or "") or (
            f"{'approved' if approved else 'denied'} by {principal.user_id}"
        )
        await backend.answer(entry.interrupt_id, principal, approved, reason)
    return runs.pop(), {entry.interrupt_id for entry in entries}


@router.post(
    "/agui",
    response_model=None,
    response_class=EventStreamResponse,
    status_code=200,
    responses={
        200: {"description": "The run as AG-UI events", "content": AGUI_STREAM},
        **errors(400, 404, 409, 413, 422, 429, 503, 401),
    },
)
async def agui_run(body: RunAgentInput, request: Request, user: CurrentUser) -> Response:
    """Run the agent for an AG-UI client: the run's events as AG-UI events (SSE). A body
    with ``resume`` answers the approvals a previous run was interrupted for and streams the
    rest of that run."""
    backend: RunBackend = request.app.state.backend
    settings: ServiceSettings = request.app.state.settings
    if body.resume:
        request_id, answered = await _resume(backend, user, body.resume)
        items = await backend.events(request_id, user, 0, settings.keepalive_s)
        quiet: set[str] | None = answered
    else:
        view = await backend.start(user, run_request(body), listening=True)
        request_id, quiet = view.request_id, None
        items = await backend.events(request_id, user, 0, settings.keepalive_s, started=True)
    translation = Translation(body.thread_id, body.run_id, request_id)
    frames = _agui_frames(backend, user, translation, items, quiet_until=quiet)
    response = EventStreamResponse(frames, settings.send_timeout_s)
    response.headers.update(run_headers(request_id))
    return response
