"""How a request to either OpenAI API of the facade becomes a run: one way for
``/v1/chat/completions`` and ``/v1/responses``.

Each call is one run started through the run layer's backend, as ``POST /v1/runs`` starts one:
the same key, gate (message size, output schema budgets, toolsets that only narrow, runs in
flight, daily quota), run timeout, approvals, cancellation, metrics and audit trail. What the
facade adds is only the mapping:

- the conversation: a session the service keeps (the client names it), or, for a request that
  stands alone, a new session seeded with the request's earlier turns (for a Responses
  ``previous_response_id``: that response's turns, then the request's) — which the gate
  measures with the message (``max_conversation_chars``) before anything is stored;
- the client's tools (``server.openai_tools``) as the run's client tools, declared around the
  start of the run (``pipeline.client_tools``); the operator's ``openai_client_tools`` setting
  says whether the agent's own tools stay visible beside them (``toolsets: []`` hides them —
  a narrowing the gate checks like any other);
- a response format as the run's ``output_schema``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from hermes_agent.audit.redaction import redact_messages
from hermes_agent.pipeline.context import ClientTurn
from hermes_agent.runs.backend import RunBackend, RunView
from hermes_agent.runs.principal import Principal, stored_session_id
from hermes_agent.runs.request import ClientTools, RunRequest
from hermes_agent.runs.settings import ServiceSettings
from hermes_agent.server.openai_schema import NO_RETRY, OpenAIError, refuse
from hermes_agent.server.openai_tools import Conversation
from hermes_agent.storage.base import SessionIdError, Storage
from hermes_agent.tools.registry import Tool
from hermes_agent.types import TOOL_CHOICE_MODES, Message

_FAILED = {"cancelled": (409, "run_cancelled"), "timed_out": (504, "run_timed_out")}


@dataclass(slots=True)
class FacadeRun:
    """What one OpenAI request asks of the agent."""

    conversation: Conversation
    session_id: str | None = None
    """The client's session, which the service keeps; ``None``: the request stands alone."""
    tool_choice: str | None = None
    """For the run: a mode, or one of the agent's own tools."""
    toolsets: list[str] | None = None
    client: ClientTurn | None = None
    output_schema: dict[str, Any] | None = None
    new_session: str | None = None
    """The id a new session gets (default: a fresh one)."""
    variables: dict[str, Any] | None = None
    """The request's ``metadata``: the run's variables (``pipeline.variables``; the gate
    refuses names that are not identifiers with a 422)."""
    set_aside: list[Message] = field(default_factory=list)
    """The request's earlier turns, not used because the session the service keeps is the
    history (``set_aside_warning`` says so in the answer when the session does not hold
    them)."""


def plan_tools(
    settings: ServiceSettings,
    tools: Sequence[Tool],
    choice: str | None,
    results: bool,
    param: str,
    *,
    structured: bool = False,
) -> tuple[str | None, list[str] | None, ClientTurn | None, str | None]:
    """For a request's client ``tools`` and ``tool_choice`` (a mode or a tool's name): the run's
    tool_choice and toolsets, the client turn (``results`` is filled in by the caller), and the
    client's tool_choice. A 400 when the operator does not serve client tools.

    ``structured``: the request asks for a JSON answer. Without tools of its own, the run then
    sees no tools at all unless the operator keeps the agent's (``openai_schema_agent_tools``):
    a client asking for its schema treats the service as a model, whose only tools are the
    ones it sends — and the agent's tools would run server-side, and keep a small model
    calling them instead of answering."""
    if not tools and not results:
        if structured and not settings.openai_schema_agent_tools:
            if choice not in (None, "auto", "none"):
                raise refuse(
                    f"tool_choice {choice!r} asks for a tool, but a request for a JSON answer "
                    "without tools of its own runs with no tools here (the operator's "
                    "service.openai_schema_agent_tools is off): send the tools, or no "
                    "tool_choice",
                    "tool_choice",
                    "invalid_value",
                )
            return None, [], None, None
        return choice, None, None, None
    if settings.openai_client_tools == "off":
        raise refuse(
            "client-side tools are not served here (service.openai_client_tools: off): the "
            "agent runs its own tools server-side; send the request without them",
            param,
        )
    names = {tool.name for tool in tools}
    with_agent_tools = settings.openai_client_tools == "with_agent_tools"
    toolsets: list[str] | None = None if with_agent_tools else []
    if choice is None or choice in TOOL_CHOICE_MODES or choice in names:
        return None, toolsets, ClientTurn(tools=tuple(tools), tool_choice=choice), choice
    if with_agent_tools:  # one of the agent's tools: the gate checks it may be used
        return choice, toolsets, ClientTurn(tools=tuple(tools)), None
    raise refuse(
        f"tool_choice names {choice!r}, which is not one of this request's tools",
        "tool_choice",
        "invalid_value",
    )


async def _seed(storage: Storage, stored: str, history: list[Message], agent: Any) -> None:
    messages = redact_messages(history, agent.redactor)  # as the agent saves its own turns
    await run_in_threadpool(storage.sessions.append, stored, messages)


async def load_session(storage: Storage, user: Principal, session_id: str) -> list[Message]:
    """The turns of one of the caller's sessions (``[]``: none)."""
    stored = stored_session_id(user.user_id, session_id)
    return await run_in_threadpool(storage.sessions.load, stored)


async def session_exists(storage: Storage, user: Principal, session_id: str) -> bool:
    """Whether one of the caller's sessions exists, with turns or none yet."""
    stored = stored_session_id(user.user_id, session_id)
    return await run_in_threadpool(storage.sessions.exists, stored)


def _said(messages: Sequence[Message]) -> list[str]:
    """What the user said in ``messages`` (the assistant's turns are the service's own)."""
    return [m.content for m in messages if m.role == "user" and m.content]


async def set_aside_warning(
    storage: Storage, user: Principal, plan: FacadeRun, session_param: str
) -> str | None:
    """What the answer says when the request's earlier user turns were not used and the
    session does not hold them (``None`` when it does: the client resent its transcript, as OpenAI
    clients do) — a client's own messages are never replaced without a word."""
    if plan.session_id is None or not plan.set_aside:
        return None
    try:
        kept = set(_said(await load_session(storage, user, plan.session_id)))
    except SessionIdError as exc:
        raise OpenAIError(400, str(exc), param=session_param, code="invalid_session_id") from None
    missing = [said for said in _said(plan.set_aside) if said not in kept]
    if not missing:
        return None
    return (
        f"{len(missing)} earlier message(s) of the request are not in session "
        f"{plan.session_id!r} and were not used: with a session, the service's stored "
        "conversation is the history; send them without a session to use them"
    )


async def start_run(
    request: Request, user: Principal, plan: FacadeRun, *, stream: bool, session_param: str
) -> tuple[RunView, str]:
    """Start the run through the backend; the run and its session id. A new session the
    caller will be told of (a Responses id) is written before the run starts — seeded with the
    request's earlier turns, or empty — so it can be continued whatever becomes of the run; one
    made for a run that then never started is removed again."""
    state = request.app.state
    backend: RunBackend = state.backend
    storage: Storage = state.storage
    session_id = plan.session_id or plan.new_session or uuid.uuid4().hex
    stored = stored_session_id(user.user_id, session_id)
    client = plan.client
    if client is not None and plan.conversation.continues:
        client = ClientTurn(client.tools, client.tool_choice, tuple(plan.conversation.results))
    history = plan.conversation.history if plan.session_id is None else []
    run_request = RunRequest(
        message=plan.conversation.input_text(),
        session_id=session_id,
        tool_choice=plan.tool_choice,
        toolsets=plan.toolsets,
        output_schema=plan.output_schema,
        stream=stream,
        client=ClientTools.of(client) if client is not None else None,
        variables=plan.variables,
    ).with_history(history)
    seeded = False
    if history:
        # The gate measures the whole conversation again as the run starts; asked here
        # first, so that a conversation too big is never written to the store.
        state.backends.gate.check_size(run_request)
        try:
            await _seed(storage, stored, history, state.agent)
        except SessionIdError as exc:
            raise OpenAIError(
                400, str(exc), param=session_param, code="invalid_session_id"
            ) from None
        seeded = True
    elif plan.new_session is not None:
        try:
            await run_in_threadpool(storage.sessions.create, stored)
        except SessionIdError as exc:
            raise OpenAIError(
                400, str(exc), param=session_param, code="invalid_session_id"
            ) from None
        seeded = True
    try:
        run = await backend.start(user, run_request)
    except SessionIdError as exc:  # a session id the store cannot hold
        raise OpenAIError(400, str(exc), param=session_param, code="invalid_session_id") from None
    except BaseException:
        if seeded:  # the run never started: leave no half-made session behind
            await run_in_threadpool(storage.sessions.delete, stored)
        raise
    return run, session_id


def run_error(run: RunView) -> OpenAIError | None:
    """The error to answer for a run that is over without an answer (or failed inside)."""
    result = run.result
    if result is not None and result.get("loop_status") == "failed":  # its status says why
        status = int(result.get("status") or 500)
        return OpenAIError(
            status if status >= 400 else 500,
            str(result.get("error") or "the run failed"),
            code="run_failed",
            headers=dict(NO_RETRY),
        )
    if run.status == "completed" and result is not None:
        return None
    status, code = _FAILED.get(run.status, (500, "run_failed"))
    return OpenAIError(
        status, run.error or f"the run {run.status}", code=code, headers=dict(NO_RETRY)
    )


def unstructured_error(run: RunView) -> OpenAIError | None:
    """For a run asked for a JSON answer (``response_format``, ``text.format``) that is over
    with a result: the error to answer when that result is not the validated value — the run
    stopped at a bound (``max_iterations``, a token or cost budget), a hook answered it, or it
    ended with no answer. Its text is an account in words, which a client would take for its
    JSON: a 422 that says why (never a ``finish_reason: "length"`` success, which the OpenAI
    SDKs would try to parse). A run that hands the client its calls is fine: the answer
    comes after them."""
    result = run.result or {}
    ending = result.get("loop_status")
    if ending == "client_tool_calls" or (ending == "completed" and result.get("status") == 200):
        return None
    status = int(result.get("status") or 422)
    stopped = result.get("stopped_by")
    why = (
        f"the run stopped at its bound {stopped} before the model gave an answer"
        if stopped
        else "the run ended without an answer"
    )
    if ending == "answered_by_hook":
        why = "a hook answered the run in its own words"
    said = str(result.get("output") or "")[:500]
    return OpenAIError(
        status if status >= 400 else 422,
        f"no answer matching the response format: {why} (what it said instead: {said!r})",
        code="no_structured_answer",
        headers=dict(NO_RETRY),
    )


def ending_error(run: RunView, *, structured: bool = False) -> OpenAIError | None:
    """The error to answer for ``run`` as it stands when the facade stops waiting: a run
    over without an answer (``run_error``; with ``structured``, also one over without the
    JSON value asked for: ``unstructured_error``), or one that neither ended nor waits for
    an approval — the service stopped following it (it is shutting down): 503 naming the
    run, never an empty answer that looks finished."""
    if run.done:
        error = run_error(run)
        if error is None and structured:
            error = unstructured_error(run)
        return error
    if run.pending_approvals:
        return None
    return OpenAIError(
        503,
        f"run {run.request_id} did not finish while this instance followed it (it is shutting "
        f"down); read it with GET /v1/runs/{run.request_id}",
        code="run_unfinished",
    )
