"""The one typed request every front door turns its input into."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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


class QueuedRequest(RunRequest):
    """A ``RunRequest`` as the queue keeps it for the workers, who read the same type back:
    plus the submitter's W3C trace context, so the worker's spans join the submitter's trace."""

    trace_context: dict[str, str] = Field(default_factory=dict)
