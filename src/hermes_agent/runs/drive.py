"""A ``RunRequest`` run on the agent: the one mapping from what a front door took to
``agent.arun``, for the in-process engine and the queue's workers alike.

What differs between the engines comes in as arguments (the session id as stored, the
streaming choice, a durable run's journal and approver); what the request says reaches the
agent here and nowhere else, so a field added to ``RunRequest`` is honoured by both engines or
by neither.
"""

from __future__ import annotations

from hermes_agent.agent import Agent
from hermes_agent.errors import OutputValidationError
from hermes_agent.pipeline.context import Approver, EventListener, StreamChoice
from hermes_agent.pipeline.journal import RunJournal
from hermes_agent.runs.request import RunRequest, declared_client
from hermes_agent.types import RunResult


async def drive(
    agent: Agent,
    request: RunRequest,
    *,
    session_id: str,
    request_id: str,
    listener: EventListener,
    stream: StreamChoice = False,
    new_session: bool = False,
    journal: RunJournal | None = None,
    approver: Approver | None = None,
) -> RunResult:
    """Run ``request`` on ``agent`` and return its result: the caller's own tools declared for
    the run (``request.client``), and an answer that never matched the request's output schema
    given back as the run's result (status 422), as a run that went through to its end."""
    try:
        return await agent.arun(
            request.message,
            session_id=session_id,
            tool_choice=request.tool_choice,
            toolsets=request.toolsets,
            listener=listener,
            stream=stream,
            dry_run=request.dry_run,
            output_format=request.output_format,
            channel=request.channel,
            output_type=request.output_schema,
            variables=request.variables,
            request_id=request_id,
            new_session=new_session,
            journal=journal,
            approver=approver,
            client=declared_client(request),
        )
    except OutputValidationError as exc:
        return exc.result
