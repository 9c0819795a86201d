"""The OpenAI Responses API of the facade: ``POST /v1/responses``, what the OpenAI SDK's
``client.responses.create`` and openai-agents' default model send.

Served: ``input`` as text or a list of items (messages with text content, ``function_call``
and ``function_call_output`` items), function ``tools`` (client tools, as in
``server.openai.chat``: their calls come back as ``function_call`` items and nothing runs),
``tool_choice``, ``text.format`` (``text``, ``json_object``, ``json_schema``: the run's output
schema), ``stream`` (``response.created`` … ``response.output_text.delta`` …
``response.function_call_arguments.delta``/``done`` … ``response.completed``), and
``previous_response_id``.

Each response is kept as a session of its own in the session store, under the caller's user
(the response id is the session id): ``previous_response_id`` starts the next response from a
copy of that one's turns, so chains can fork as with OpenAI, and another user's response id is
a 404. ``instructions`` (like ``system`` messages) are ignored: the agent's instructions are
its config's. Refused with 400, naming the field: built-in tools (web search, files, ...),
non-text input, ``background``, ``conversation``, ``prompt`` and ``include``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

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
    load_session,
    plan_tools,
    session_exists,
    start_run,
)
from hermes_agent.server.openai.tools import (
    ConversationBuilder,
    arguments_of,
    client_tools,
    handed_out,
    output_schema,
    tool_choice_name,
)
from hermes_agent.server.openai.wire import (
    OpenAIError,
    OpenAIRoute,
    ResponsesRequest,
    check_model,
    check_supported,
    content_text,
    documented_errors,
    refuse,
)
from hermes_agent.server.sse import KEEPALIVE_COMMENT, EventStreamResponse, to_json
from hermes_agent.storage.base import Storage
from hermes_agent.types import Message

router = APIRouter(prefix="/v1", route_class=OpenAIRoute, tags=["OpenAI-compatible"])

RESPONSE_PREFIX = "resp_"


# -- the request ------------------------------------------------------------------------------


def _read_input(body: ResponsesRequest, prior: list[Message]) -> ConversationBuilder:
    turns = ConversationBuilder(prior)
    if isinstance(body.input, str):
        turns.user(body.input)
        return turns
    for index, item in enumerate(body.input):
        where = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            text = content_text(item.get("content"), f"{where}.content")
            if role == "user":
                turns.user(text)
            elif role == "assistant":
                turns.assistant(text)
            elif role not in ("system", "developer"):  # instructions come from the config
                raise refuse(f"{where}.role must be user, assistant, system or developer", where)
        elif kind == "function_call":
            name, arguments = item.get("name"), item.get("arguments", "")
            if not isinstance(name, str) or not isinstance(arguments, str):
                raise refuse(f"{where} needs a name and arguments as text", where, "invalid_value")
            call_id = str(item.get("call_id") or "")
            turns.call(call_id, name, arguments_of(arguments, f"{where}.arguments"), where)
        elif kind == "function_call_output":
            output = item.get("output")
            text = content_text(output, f"{where}.output")
            turns.result(item.get("call_id"), text, where)
        elif kind == "reasoning":
            continue  # a model's reasoning from elsewhere: never sent back to the model
        else:
            raise refuse(f"{where} is a {kind!r} item, which this agent does not serve", where)
    return turns


_REFUSED = {
    "background": "background responses are not served; leave background out",
    "conversation": "'conversation' is not served; chain with previous_response_id",
    "prompt": "'prompt' is not served; chain with previous_response_id",
    "include": "include is not served: nothing extra can be added",
}


def _declared(tools: list[dict[str, Any]] | None) -> list[tuple[str, str | None, Any]]:
    declared = []
    for index, tool in enumerate(tools or []):
        where = f"tools[{index}]"
        if tool.get("type") != "function":
            raise refuse(
                f"{where} is a {tool.get('type')!r} tool; only function tools (run by the "
                "client) are served: the agent's own tools are in its config",
                where,
            )
        name, parameters = tool.get("name"), tool.get("parameters")
        if not isinstance(name, str) or not name:
            raise refuse(f"{where} needs a name", where, "invalid_value")
        if parameters is not None and not isinstance(parameters, dict):
            raise refuse(f"{where}.parameters must be a JSON Schema object", where, "invalid_value")
        description = tool.get("description")
        declared.append((name, description if isinstance(description, str) else None, parameters))
    return declared


async def plan_response(
    body: ResponsesRequest, user: Principal, storage: Storage, settings: ServiceSettings
) -> FacadeRun:
    """Check the request and map it onto a run whose session is the new response."""
    check_supported(body, _REFUSED)
    prior: list[Message] = []
    if body.previous_response_id is not None:
        previous = body.previous_response_id
        known = previous.startswith(RESPONSE_PREFIX)
        if known:
            prior = await load_session(storage, user, previous)
        # A response whose run saved no turn (it failed, or its service was killed) exists
        # with no message: it is continued from the turns before it.
        if not prior and not (known and await session_exists(storage, user, previous)):
            raise OpenAIError(
                404,
                f"no response {previous!r} here (responses are kept per user)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
    conversation = _read_input(body, prior).finish("input")
    tools = client_tools(_declared(body.tools), "tools")
    choice = tool_choice_name(body.tool_choice, nested=False)
    text_format = body.text.format if body.text is not None else None
    schema = output_schema(text_format, "text.format")
    run_choice, toolsets, client, _ = plan_tools(
        settings,
        tools,
        choice,
        conversation.continues,
        "tools" if tools else "input",
        structured=schema is not None,
    )
    new = RESPONSE_PREFIX + uuid.uuid4().hex
    variables = dict(body.metadata) if body.metadata else None  # the run's variables
    return FacadeRun(
        conversation,
        None,
        run_choice,
        toolsets,
        client,
        schema,
        new_session=new,
        variables=variables,
    )


# -- the answer -------------------------------------------------------------------------------


def _message_item(run: RunView, text: str, status: str = "completed") -> dict[str, Any]:
    parts = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "id": f"msg_{run.request_id.replace('-', '')}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": parts if status == "completed" else [],
    }


def _call_items(result: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [
        {
            "id": f"fc_{call['id']}",
            "type": "function_call",
            "call_id": call["id"],
            "name": call["name"],
            "arguments": to_json(call["arguments"]),
            "status": "completed",
        }
        for call in handed_out(result)
    ]


def response_body(
    run: RunView, response_id: str, body: ResponsesRequest, text: str | None = None
) -> dict[str, Any]:
    """The ``response`` object for a run (over, waiting for an approval, or just started)."""
    result = run.result or {}
    output: list[dict[str, Any]] = []
    status, incomplete = "completed", None
    if run.pending_approvals and not run.done:
        status = "in_progress"
        notice = "\n\n".join(approval_notice(p, streaming=False) for p in run.pending_approvals)
        output.append(_message_item(run, notice))
    elif run.result is not None:
        said = str(result.get("output", "")) if text is None else text
        if said:
            output.append(_message_item(run, said))
        output += _call_items(result)
        if result.get("loop_status") in ("max_iterations", "budget_exceeded"):
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    else:
        status = "in_progress"
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(run.created or time.time()),
        "status": status,
        "model": body.model,
        "output": output,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": body.instructions,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens,
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
        "text": {"format": (body.text.format if body.text else None) or {"type": "text"}},
        "truncation": body.truncation or "disabled",
        "reasoning": None,
        "store": True,
        "usage": usage(run.result, "responses") if run.result is not None else None,
        "hermes": extension(run),
    }


class _Events:
    """The stream's events, numbered in order (``sequence_number``)."""

    def __init__(self) -> None:
        self.number = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.number, **fields}
        self.number += 1
        return f"event: {kind}\ndata: {to_json(data)}\n\n"


async def response_events(
    backend: RunBackend,
    principal: Principal,
    run: RunView,
    response_id: str,
    body: ResponsesRequest,
    keepalive: float,
) -> AsyncIterator[str]:
    """The run as Responses stream events. The message item opens with the first text; the
    client's calls are sent once checked (a call the model has to redo is never streamed to a
    client that would run it); the last event is ``response.completed`` (or
    ``response.incomplete`` / ``response.failed``) with the whole response."""
    event = _Events()
    started = response_body(run, response_id, body)
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    structured = output_schema(body.text.format if body.text else None, "text.format") is not None
    answer = AnswerText(structured=structured)
    message_id = _message_item(run, "")["id"]
    opened = False

    def text_events(text: str) -> list[str]:
        nonlocal opened
        frames = []
        if not opened:
            opened = True
            frames.append(
                event(
                    "response.output_item.added",
                    output_index=0,
                    item=_message_item(run, "", "in_progress"),
                )
            )
            frames.append(
                event(
                    "response.content_part.added",
                    item_id=message_id,
                    output_index=0,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                )
            )
        frames.append(
            event(
                "response.output_text.delta",
                item_id=message_id,
                output_index=0,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return frames

    pieces = answer_pieces(backend, principal, run, keepalive, answer)
    async with aclosing(pieces):
        async for piece in pieces:
            if piece is None:
                yield KEEPALIVE_COMMENT
                continue
            for frame in text_events(piece.text):
                yield frame
    run = await backend.view(run.request_id, principal)
    error = ending_error(run, structured=structured)
    if error is not None:
        failed = response_body(run, response_id, body, answer.sent)
        failed["status"] = "failed"
        failed["error"] = {"code": error.code or "server_error", "message": error.message}
        yield event("response.failed", response=failed)
        return
    final = response_body(run, response_id, body, answer.sent)
    if opened:
        done_part = {"type": "output_text", "text": answer.sent, "annotations": [], "logprobs": []}
        common = {"item_id": message_id, "output_index": 0, "content_index": 0}
        yield event("response.output_text.done", **common, text=answer.sent, logprobs=[])
        yield event("response.content_part.done", **common, part=done_part)
        yield event("response.output_item.done", output_index=0, item=final["output"][0])
    calls = [o for o in final["output"] if o["type"] == "function_call"]
    for index, call in enumerate(calls, start=int(opened)):
        yield event(
            "response.output_item.added",
            output_index=index,
            item={**call, "arguments": "", "status": "in_progress"},
        )
        yield event(
            "response.function_call_arguments.delta",
            item_id=call["id"],
            output_index=index,
            delta=call["arguments"],
        )
        yield event(
            "response.function_call_arguments.done",
            item_id=call["id"],
            output_index=index,
            name=call["name"],
            arguments=call["arguments"],
        )
        yield event("response.output_item.done", output_index=index, item=call)
    ending = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield event(ending, response=final)


# -- the endpoint -----------------------------------------------------------------------------


@router.post(
    "/responses",
    responses={
        200: {
            "description": "A response; with stream: true, Responses stream events",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {
                    "itemSchema": {
                        "type": "object",
                        "required": ["data"],
                        "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
                    }
                },
            },
        },
        **documented_errors(400, 401, 404, 409, 413, 422, 429, 500, 502, 503, 504),
    },
)
async def create_response(body: ResponsesRequest, request: Request, user: CurrentUser) -> Response:
    """An OpenAI response answered by the agent (see ``openai.responses``)."""
    state = request.app.state
    settings: ServiceSettings = state.settings
    backend: RunBackend = state.backend
    check_model(body.model, "model")
    plan = await plan_response(body, user, state.storage, settings)
    run, response_id = await start_run(
        request, user, plan, stream=bool(body.stream), session_param="previous_response_id"
    )
    if body.stream:
        return EventStreamResponse(
            response_events(backend, user, run, response_id, body, settings.keepalive_s),
            settings.send_timeout_s,
        )
    run = await backend.wait(run.request_id, user, started=True)
    error = ending_error(run, structured=plan.output_schema is not None)
    if error is not None:
        raise error
    return Response(to_json(response_body(run, response_id, body)), media_type="application/json")
