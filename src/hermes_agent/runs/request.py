"""The one typed request every front door turns its input into."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PrivateAttr

from hermes_agent.pipeline.client_tools import client_tool
from hermes_agent.pipeline.context import ClientTurn
from hermes_agent.types import Message, ToolResult


class ClientToolSpec(BaseModel):
    """One tool the caller declares and runs itself: its OpenAI function declaration."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None


class ClientToolOutcome(BaseModel):
    """What the caller's run of one handed-out call returned."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    name: str
    content: Any = None
    status_code: int = 200
    error: str | None = None


class ClientTools(BaseModel):
    """The caller's own tools for a run (the OpenAI facade's client tools): declared, shown to
    the model and checked, never run by the runtime — a turn that calls them ends the run with
    the calls (``pipeline.client_tools``). ``results`` are the caller's runs of the calls the
    previous run handed out: the run's input, in place of a user message. Plain data, so it
    travels to the queue's workers like the rest of the request."""

    model_config = ConfigDict(extra="forbid")

    tools: list[ClientToolSpec] = Field(default_factory=list)
    tool_choice: str | None = None
    results: list[ClientToolOutcome] = Field(default_factory=list)

    @classmethod
    def of(cls, turn: ClientTurn) -> ClientTools:
        """The request's form of a ``ClientTurn``."""
        return cls(
            tools=[
                ClientToolSpec(name=t.name, description=t.description, parameters=t.parameters)
                for t in turn.tools
            ],
            tool_choice=turn.tool_choice,
            results=[
                ClientToolOutcome(
                    call_id=r.call_id,
                    name=r.name,
                    content=r.content,
                    status_code=r.status_code,
                    error=r.error,
                )
                for r in turn.results
            ],
        )

    def turn(self) -> ClientTurn:
        """The ``ClientTurn`` an engine declares around the run (``client_turn``); a schema
        over the budgets is ``ToolDefinitionError``."""
        return ClientTurn(
            tools=tuple(client_tool(t.name, t.description, t.parameters) for t in self.tools),
            tool_choice=self.tool_choice,
            results=tuple(
                ToolResult(r.call_id, r.name, r.content, r.status_code, r.error)
                for r in self.results
            ),
        )


class RunRequest(BaseModel):
    """A run to start: the body of ``POST /v1/runs`` and of a WebSocket ``run`` message, and
    what the OpenAI facade, channels inbound, the MCP server and the queue's workers read.

    ``toolsets`` and ``tool_choice`` can only narrow what the service's agent exposes (the gate
    refuses anything else with 422)."""

    model_config = ConfigDict(extra="forbid")

    message: str
    session_id: str | None = None
    tool_choice: str | None = None
    toolsets: list[str] | None = None
    dry_run: bool = False
    output_format: str | None = None
    output_schema: dict[str, Any] | None = None
    """A JSON Schema the answer must match: the result's ``data`` is the validated value, and
    a run whose answer never matches (retries included) ends with status 422."""
    channel: str | None = None
    stream: bool = False
    variables: dict[str, JsonValue] | None = None
    """Request data for this run (``{"lang": "zh", "tier": "gold"}``): its hooks see them as
    ``ctx.variables``, ``{{ lang }}`` in the system prompt is filled from them and the trail
    records them (``pipeline.variables``); the gate bounds them (413 too big, 422 otherwise)."""
    client: ClientTools | None = None
    """The caller's own tools (the OpenAI facade's client tools), in either engine."""

    # Not a field: no body can set it. The door that seeds a new session with turns the
    # caller sent (the OpenAI facade's stand-alone conversations) names them here, so the
    # gate measures the whole conversation, not only its last message.
    _history: tuple[Message, ...] = PrivateAttr(default=())

    @property
    def history(self) -> tuple[Message, ...]:
        """The turns before ``message`` that the caller brought (``with_history``)."""
        return self._history

    def with_history(self, turns: Sequence[Message]) -> RunRequest:
        """This request, bringing ``turns`` as the conversation before its message."""
        self._history = tuple(turns)
        return self


class QueuedRequest(RunRequest):
    """A ``RunRequest`` as the queue keeps it for the workers, who read the same type back:
    plus the submitter's W3C trace context, so the worker's spans join the submitter's trace."""

    trace_context: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def of(cls, request: RunRequest, trace_context: Mapping[str, str]) -> QueuedRequest:
        """``request`` as the queue keeps it, with the submitter's trace context. Its session
        id stays out: the store keeps the run's session (as stored) in a column of its own."""
        return cls(
            **request.model_dump(exclude={"session_id"}, exclude_defaults=True),
            trace_context=dict(trace_context),
        )


def declared_client(request: RunRequest) -> ClientTurn | None:
    """What ``request``'s caller brings and runs itself, as ``agent.arun`` takes it
    (``client``), or ``None``."""
    return request.client.turn() if request.client is not None else None
