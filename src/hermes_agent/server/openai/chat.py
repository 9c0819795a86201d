"""The OpenAI-compatible facade: ``POST /v1/chat/completions``, ``GET /v1/models``, and a 404
naming the endpoints that exist for any other ``/v1/...`` path (``POST /v1/responses`` is in
``server.openai.responses``).

An existing OpenAI client talks to the agent with no change but its base URL and key::

    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=key)
    reply = client.chat.completions.create(
        model="hermes-agent", messages=[{"role": "user", "content": "What is 17 * 23?"}]
    )

Each call is one run started through the run layer's backend (``server.openai.runs``), exactly
as ``POST /v1/runs`` starts one. Two ways to use it:

- **The agent's tools, run server-side** (no ``tools`` in the request): the agent runs its own
  tools and the client gets the answer. What ran is in the extension field ``hermes``
  (``request_id``, ``session_id``, ``status``, ``tool_calls`` with their results,
  ``approvals``, ``warnings``), never in ``tool_calls``, which would make the client run them.
- **The client's tools** (``tools``): the facade is a protocol adapter for the agent's model
  (``server.openai.tools``). The model is shown the client's tools, its calls are parsed and
  checked against the client's schemas (an invalid call goes back to the model with the
  errors), and valid ones come back as ``tool_calls`` with ``finish_reason: "tool_calls"`` —
  nothing runs. The client runs them and sends the ``tool`` messages; the run goes on from
  there. The operator's ``service.openai_client_tools`` says whether the agent's own tools stay
  visible beside the client's (``alone``, the default: only the client's; ``with_agent_tools``;
  ``off``: client tools are refused).

How a request becomes a run:

- The run's input is the end of the conversation: the user's last message, or the ``tool``
  messages that answer the last assistant turn's calls.
- The session: the ``X-Hermes-Session-Id`` header (or, where the operator set
  ``service.openai_user_sessions``, the ``user`` field; otherwise ``user`` names an end user,
  never a conversation). With a session, the service keeps the conversation and the
  request's earlier messages are not used (clients resend the whole transcript each time;
  the stored one is the history, so nothing is counted twice); earlier user messages the
  session does not hold are named in ``hermes.warnings``. Without one, the request stands
  alone, as with OpenAI: its earlier messages become the history of a new session
  (consecutive messages of one role joined; the gate measures them with the message,
  ``max_conversation_chars``), and the answer names that session (``hermes.session_id`` and
  the ``X-Hermes-Session-Id`` header).
- ``system`` and ``developer`` messages are ignored: the agent's instructions are its
  config's, which a caller cannot replace.
- ``tool_choice``: ``auto``, ``none``, ``required``, or ``{"type": "function", "function":
  {"name": ...}}`` naming one of the run's tools. ``response_format`` ``json_object`` or
  ``json_schema`` makes the answer JSON that must validate (the run's ``output_schema``; an
  answer that does not is sent back to the model with the errors, then 422). ``functions``,
  ``n`` > 1, ``logprobs``, audio and non-text content are refused with 400. Sampling settings
  (``temperature``, ``max_tokens``, ``stop``, ...) are checked and ignored: the agent's model
  settings come from its config.
- Errors have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``. A run
  that started and then failed is never worth a blind retry (its tools may have run), so
  such answers carry ``x-should-retry: false``, which the OpenAI SDKs obey.

Approvals: a tool that needs one pauses the run as everywhere else. A plain call answers at
once with an assistant message that says what waits and how to answer it
(``POST /v1/approvals/{id}``), and ``hermes.status = "waiting_approval"`` with the pending
approvals; the run goes on once it is answered (its answer: ``GET /v1/runs/{request_id}``,
and the session's history). A stream sends that message as content and stays open: the
answer follows in the same stream once the approval is answered, denied or expired.

``id`` is ``chatcmpl-<request_id>``: ``POST /v1/runs/{request_id}/cancel`` stops the run; a
client that drops its connection does not.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request
from starlette.responses import JSONResponse, Response

from hermes_agent.runs.backend import RunBackend, RunView
from hermes_agent.runs.principal import Principal
from hermes_agent.runs.settings import ServiceSettings
from hermes_agent.server.auth import CurrentUser
from hermes_agent.server.openai.answer import (
    AnswerText,
    answer_pieces,
    approval_notice,
    extension,
    usage,
)
from hermes_agent.server.openai.runs import (
    FacadeRun,
    ending_error,
    plan_tools,
    set_aside_warning,
    start_run,
)
from hermes_agent.server.openai.tools import (
    ConversationBuilder,
    arguments_of,
    chat_tool_calls,
    client_tools,
    handed_out,
    output_schema,
    tool_choice_name,
)
from hermes_agent.server.openai.wire import (
    MODEL_ID,
    SESSION_HEADER,
    ChatCompletion,
    ChatCompletionRequest,
    ModelCard,
    ModelList,
    OpenAIError,
    OpenAIRoute,
    check_model,
    check_supported,
    content_text,
    documented_errors,
    refuse,
    served_models,
)
from hermes_agent.server.sse import KEEPALIVE_COMMENT, EventStreamResponse, to_json
from hermes_agent.types import Message

router = APIRouter(prefix="/v1", route_class=OpenAIRoute, tags=["OpenAI-compatible"])


# -- the request ------------------------------------------------------------------------------


_REFUSED = {
    "functions": "'functions' is not supported by this agent: use tools",
    "function_call": "'function_call' is not supported by this agent: use tool_choice",
    "audio": "'audio' is not supported by this agent: it answers in text",
    "prediction": "'prediction' is not supported by this agent",
    "web_search_options": "'web_search_options' is not supported by this agent",
    "logprobs": "logprobs are not available from an agent's answer",
    "top_logprobs": "logprobs are not available from an agent's answer",
}


def _check_request(body: ChatCompletionRequest) -> None:
    if body.n is not None and body.n > 1:
        raise refuse("n must be 1: the agent gives one answer per run", "n")
    if body.modalities is not None and body.modalities != ["text"]:
        raise refuse("this agent answers in text only (modalities: ['text'])", "modalities")
    check_supported(body, _REFUSED)


def _conversation(body: ChatCompletionRequest) -> ConversationBuilder:
    turns = ConversationBuilder()
    for index, message in enumerate(body.messages):
        where = f"messages[{index}]"
        if message.role == "function" or message.function_call:
            raise refuse(f"{where}: functions are replaced by tools; use tools", where)
        if message.audio is not None:
            raise refuse(f"{where} carries audio", f"{where}.audio")
        text = content_text(message.content, f"{where}.content")
        if message.role in ("system", "developer"):
            continue  # the agent's instructions come from its config
        if message.role == "user":
            turns.user(text)
        elif message.role == "assistant":
            turns.assistant(text)
            for number, call in enumerate(message.tool_calls or []):
                at = f"{where}.tool_calls[{number}]"
                function = call.get("function")
                if call.get("type", "function") != "function" or not isinstance(function, dict):
                    raise refuse(f"{at} must be a function call", at, "invalid_value")
                name, arguments = function.get("name"), function.get("arguments", "")
                if not isinstance(name, str) or not isinstance(arguments, str):
                    raise refuse(f"{at} needs a name and arguments as text", at, "invalid_value")
                parsed = arguments_of(arguments, f"{at}.function.arguments")
                turns.call(str(call.get("id") or ""), name, parsed, at)
        else:  # a tool's result
            turns.result(message.tool_call_id, text, where)
    return turns


def plan_run(
    body: ChatCompletionRequest, session_header: str | None, settings: ServiceSettings
) -> FacadeRun:
    """Check the request and map it onto a run (``OpenAIError`` for what cannot be served)."""
    _check_request(body)
    conversation = _conversation(body).finish("messages")
    declared = [
        (t.function.name, t.function.description, t.function.parameters) for t in body.tools or []
    ]
    tools = client_tools(declared, "tools")
    choice = tool_choice_name(body.tool_choice)
    schema = output_schema(body.response_format, "response_format")
    run_choice, toolsets, client, _ = plan_tools(
        settings,
        tools,
        choice,
        conversation.continues,
        "tools" if tools else "messages",
        structured=schema is not None,
    )
    session = session_header
    if session is None and settings.openai_user_sessions:  # the operator's choice
        session = body.user
    if session is not None and not session.strip():
        param = SESSION_HEADER if session_header is not None else "user"
        raise refuse("the session id is empty", param, "invalid_value")
    set_aside: list[Message] = []
    if session is not None:  # the service keeps the conversation: only the new input counts
        set_aside, conversation.history = conversation.history, []
    variables = dict(body.metadata) if body.metadata else None  # the run's variables
    return FacadeRun(
        conversation,
        session,
        run_choice,
        toolsets,
        client,
        schema,
        variables=variables,
        set_aside=set_aside,
    )


# -- the answer -------------------------------------------------------------------------------


def _finish_reason(result: dict[str, Any]) -> str:
    status = result.get("loop_status")
    if status == "client_tool_calls":
        return "tool_calls"
    return "length" if status in ("max_iterations", "budget_exceeded") else "stop"


def completion_body(
    run: RunView, model: str, notes: Sequence[str] = (), *, structured: bool = False
) -> dict[str, Any]:
    """A ``chat.completion`` for a run that is over, or that waits for an approval. With
    ``structured`` (a JSON ``response_format``), a turn that hands out calls has no content:
    its words are not the JSON asked for, which comes after the calls."""
    pending = run.pending_approvals
    message: dict[str, Any] = {"role": "assistant", "refusal": None}
    if pending and not run.done:
        message["content"] = "\n\n".join(approval_notice(p, streaming=False) for p in pending)
        finish = "stop"
    else:
        result = run.result or {}
        calls = handed_out(result)
        said = "" if structured and calls else str(result.get("output", ""))
        message["content"] = said or (None if calls else "")
        if calls:
            message["tool_calls"] = chat_tool_calls(calls)
        finish = _finish_reason(result)
    return {
        "id": f"chatcmpl-{run.request_id}",
        "object": "chat.completion",
        "created": int(run.created or 0),
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage(run.result, "chat"),
        "hermes": extension(run, notes),
    }


def _frame(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else to_json(data)}\n\n"


async def completion_chunks(
    backend: RunBackend,
    principal: Principal,
    run: RunView,
    model: str,
    include_usage: bool,
    keepalive: float,
    notes: Sequence[str] = (),
    *,
    structured: bool = False,
) -> AsyncIterator[str]:
    """The run as ``chat.completion.chunk`` SSE frames, then ``data: [DONE]``. The caller
    started the run listening; this stops following it when the stream ends (finished, or
    the client gone). ``structured``: only the validated JSON value is sent as content
    (``AnswerText``), and a run over without it ends with an error frame."""
    base: dict[str, Any] = {
        "id": f"chatcmpl-{run.request_id}",
        "object": "chat.completion.chunk",
        "created": int(run.created or 0),
        "model": model,
        "system_fingerprint": None,
    }
    if include_usage:
        base["usage"] = None

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _frame({**base, "choices": [choice], **extra})

    answer = AnswerText(structured=structured)
    first = {"request_id": run.request_id, "session_id": run.session_id, "status": "running"}
    yield chunk({"role": "assistant", "content": ""}, hermes=first)
    pieces = answer_pieces(backend, principal, run, keepalive, answer)
    async with aclosing(pieces):
        async for piece in pieces:
            if piece is None:
                yield KEEPALIVE_COMMENT
            elif piece.approval is not None:
                yield chunk({"content": piece.text}, hermes={"approval_required": piece.approval})
            else:
                yield chunk({"content": piece.text})
    run = await backend.view(run.request_id, principal)
    error = ending_error(run, structured=structured)
    if error is not None:
        yield _frame(error.body())
    else:
        # The client's calls go out once they are checked: a call the model has to redo
        # is never streamed to a client that would run it.
        calls = chat_tool_calls(handed_out(run.result))
        if calls:
            yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
        yield chunk({}, _finish_reason(run.result or {}), hermes=extension(run, notes))
        if include_usage:
            yield _frame({**base, "choices": [], "usage": usage(run.result, "chat")})
    yield _frame("[DONE]")


# -- the endpoints ----------------------------------------------------------------------------


@router.get("/models", response_model=ModelList, responses=documented_errors(401))
async def list_models(request: Request, user: CurrentUser) -> Response:
    """The models this service answers as: one, the agent."""
    return JSONResponse({"object": "list", "data": served_models()})


@router.get("/models/{model_id}", response_model=ModelCard, responses=documented_errors(401, 404))
async def get_model(
    model_id: Annotated[str, Path(examples=[MODEL_ID])], request: Request, user: CurrentUser
) -> Response:
    """One model, if the service answers as it."""
    return JSONResponse(check_model(model_id, "model_id"))


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    responses={
        200: {
            "description": "A chat.completion; with stream: true, chat.completion.chunk events",
            "content": {
                "text/event-stream": {
                    "itemSchema": {  # each frame: data: <a chunk's JSON> (or [DONE], last)
                        "type": "object",
                        "required": ["data"],
                        "properties": {"data": {"type": "string"}},
                    },
                    "example": 'data: {"object": "chat.completion.chunk", ...}\n\ndata: [DONE]\n\n',
                }
            },
        },
        **documented_errors(400, 401, 404, 409, 413, 422, 429, 500, 502, 503, 504),
    },
)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    user: CurrentUser,
    session_header: Annotated[str | None, Header(alias=SESSION_HEADER)] = None,
) -> Response:
    """An OpenAI chat completion answered by the agent (see ``openai.chat``)."""
    settings: ServiceSettings = request.app.state.settings
    backend: RunBackend = request.app.state.backend
    check_model(body.model, "model")
    plan = plan_run(body, session_header, settings)
    session_param = SESSION_HEADER if session_header is not None else "user"
    warning = await set_aside_warning(request.app.state.storage, user, plan, session_param)
    notes = [warning] if warning is not None else []
    structured = plan.output_schema is not None
    run, session_id = await start_run(
        request, user, plan, stream=bool(body.stream), session_param=session_param
    )
    headers = {SESSION_HEADER: session_id}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        response = EventStreamResponse(
            completion_chunks(
                backend,
                user,
                run,
                body.model,
                include_usage,
                settings.keepalive_s,
                notes,
                structured=structured,
            ),
            settings.send_timeout_s,
        )
        response.headers.update(headers)
        return response
    run = await backend.wait(run.request_id, user, started=True)
    error = ending_error(run, structured=structured)
    if error is not None:
        error.headers = {**(error.headers or {}), **headers}
        raise error
    return Response(
        to_json(completion_body(run, body.model, notes, structured=structured)),
        media_type="application/json",
        headers=headers,
    )


# -- any other path under /v1 ---------------------------------------------------------------

fallback = APIRouter(include_in_schema=False)
"""Mounted last: a path under ``/v1`` that no route serves gets a 404 in OpenAI's shape that
lists the endpoints there are (a client pointed at an API this service lacks learns what it
has), and a known path with another method a 405."""


def _operations(request: Request) -> dict[str, list[str]]:
    """The methods of each ``/v1/...`` path of the service's OpenAPI schema (built once)."""
    paths = request.app.openapi().get("paths", {})
    return {
        path: [method.upper() for method in operations]
        for path, operations in paths.items()
        if path.startswith("/v1/")
    }


def _template(path: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(path)) + "$")


@fallback.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def unknown_endpoint(request: Request, path: str) -> Response:
    """404 (or 405) for what no route serves, naming the endpoints there are."""
    operations = _operations(request)
    for template, methods in operations.items():
        if _template(template).match(request.url.path):  # the path exists, with other methods
            allowed = ", ".join(methods)
            return OpenAIError(
                405,
                f"{request.method} is not allowed on {request.url.path}; use {allowed}",
                code="method_not_allowed",
                headers={"Allow": allowed},
            ).response()
    endpoints = [f"{m} {template}" for template, methods in operations.items() for m in methods]
    return OpenAIError(
        404,
        f"no endpoint {request.method} {request.url.path} here; this service serves: "
        + ", ".join(endpoints),
        code="unknown_endpoint",
    ).response()
