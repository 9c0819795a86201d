"""The OpenAI-compatible facade: ``POST /v1/chat/completions`` and ``GET /v1/models``.

An existing OpenAI client talks to the agent with no change but its base URL and key::

    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=key)
    reply = client.chat.completions.create(
        model="hermes-agent", messages=[{"role": "user", "content": "What is 17 * 23?"}]
    )

Each call is one run started through the run layer's backend, exactly as ``POST /v1/runs`` starts
one: the same key, limits, quotas, run timeout, approvals, cancellation, metrics and audit
trail. The agent runs its own tools server-side; the client gets the answer.

How a request becomes a run:

- The run's message is the last message of the request, which must come from the user.
- The session: the ``X-Hermes-Session-Id`` header, else the ``user`` field. With a session,
  the service keeps the conversation and the request's earlier messages are ignored (clients
  resend the whole transcript each time; the stored one is the history, so nothing is
  counted twice). Without one, the request stands alone, as with OpenAI: its earlier user and
  assistant messages become the history of a new session (consecutive messages of one role
  joined), and the answer names that session (``hermes.session_id`` and the
  ``X-Hermes-Session-Id`` header) for a client that wants the service to keep it from then on.
- ``system`` and ``developer`` messages are ignored: the agent's instructions are its
  config's, which a caller cannot replace.
- ``tool_choice`` applies to the agent's own tools (``auto``, ``none``, ``required``, or
  ``{"type": "function", "function": {"name": ...}}`` naming one). Client-side tools
  (``tools``, ``functions``, ``tool`` messages, assistant ``tool_calls``), ``n`` > 1,
  ``logprobs``, audio and non-text content are refused with 400. Sampling settings
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

What ran server-side is in the extension field ``hermes`` (``request_id``, ``session_id``,
``status``, ``tool_calls`` with their results, ``approvals``, ``warnings``), never in
``tool_calls``, which would make the client try to run them. ``id`` is
``chatcmpl-<request_id>``: ``POST /v1/runs/{request_id}/cancel`` stops the run; a client that
drops its connection does not.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from hermes_agent.audit.redaction import redact_messages
from hermes_agent.errors import HermesAgentError
from hermes_agent.runs.backend import RunBackend, RunView
from hermes_agent.runs.principal import Principal
from hermes_agent.server.auth import CurrentUser
from hermes_agent.server.runs import RunRejected, RunRequest, stored_session_id
from hermes_agent.server.settings import ServiceSettings
from hermes_agent.server.sse import KEEPALIVE_COMMENT, EventStreamResponse, to_json
from hermes_agent.storage.base import SessionIdError, Storage
from hermes_agent.types import Message

MODEL_ID = "hermes-agent"
"""The one model the facade lists: the agent, tools and all."""
SESSION_HEADER = "X-Hermes-Session-Id"
_CREATED = int(time.time())
_NO_RETRY = {"x-should-retry": "false"}
_FAILED = {"cancelled": (409, "run_cancelled"), "timed_out": (504, "run_timed_out")}


# -- errors in OpenAI's shape ---------------------------------------------------------------


class OpenAIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {
            "error": {
                "message": self.message,
                "type": error_type(self.status_code),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> Response:
        """The answer."""
        return JSONResponse(self.body(), self.status_code, headers=self.headers)


def error_type(status_code: int) -> str:
    """OpenAI's ``type`` for a status code."""
    if status_code == 401:
        return "authentication_error"
    if status_code == 429:
        return "rate_limit_error"
    if status_code >= 500:
        return "server_error"
    return "invalid_request_error"


_HTTP_CODES = {
    401: "invalid_api_key",
    404: "not_found",
    409: "conflict",
    413: "request_too_large",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}


def _from_validation(exc: RequestValidationError) -> OpenAIError:
    issue = exc.errors()[0]
    source, *loc = issue.get("loc", ("body",))
    param = _param(loc) if source == "body" else str(loc[-1]) if loc else None
    kind = issue.get("type", "")
    if kind == "json_invalid":
        return OpenAIError(400, "the request body is not valid JSON", code="invalid_json")
    if kind == "extra_forbidden":
        return OpenAIError(
            400,
            f"Unrecognized request argument supplied: {param}",
            param=param,
            code="unknown_parameter",
        )
    if kind == "missing":
        return OpenAIError(
            400,
            f"Missing required parameter: '{param}'",
            param=param,
            code="missing_required_parameter",
        )
    where = f"'{param}'" if param else "the request body"
    message = f"Invalid value for {where}: {issue.get('msg', 'invalid')}"
    return OpenAIError(400, message, param=param, code="invalid_value")


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


def _param(loc: list[Any]) -> str | None:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif "[" in part or "-" in part or part in _TYPE_NAMES:
            continue  # pydantic names the member of a union it tried; the param is the field
        else:
            text += f".{part}" if text else str(part)
    return text or None


def as_openai_error(exc: Exception) -> OpenAIError | None:
    """The OpenAI-shaped form of what the service raises, or ``None`` for the unexpected."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, RequestValidationError):
        return _from_validation(exc)
    if isinstance(exc, HTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else to_json(exc.detail)
        return OpenAIError(
            exc.status_code,
            detail,
            code=_HTTP_CODES.get(exc.status_code),
            headers=dict(exc.headers or {}),
        )
    if isinstance(exc, RunRejected):
        retry = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
        return OpenAIError(
            exc.status_code, exc.message, code=_HTTP_CODES.get(exc.status_code), headers=retry
        )
    if isinstance(exc, SessionIdError):
        return OpenAIError(400, str(exc), param="user", code="invalid_session_id")
    if isinstance(exc, HermesAgentError):  # refused before it started (e.g. tool_choice)
        return OpenAIError(422, str(exc), code="refused")
    return None


class OpenAIRoute(APIRoute):
    """A route whose every error — a bad body, a missing key, a limit — has OpenAI's shape, so
    the OpenAI SDKs raise their usual exceptions with the service's message."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                error = as_openai_error(exc)
                if error is None:
                    raise
                return error.response()

        return route


router = APIRouter(prefix="/v1", route_class=OpenAIRoute, tags=["OpenAI-compatible"])


# -- the request ------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContentPart(BaseModel):
    """One part of a message's content; only ``{"type": "text", "text": ...}`` is served."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(_Strict):
    """One message of ``messages``."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: dict[str, Any] | None = None


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ChatCompletionRequest(_Strict):
    """The body of ``POST /v1/chat/completions`` (OpenAI's, less what a server-side agent
    cannot honour; see the module docstring)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hello"}]},
                {
                    "model": MODEL_ID,
                    "messages": [{"role": "user", "content": "Hello"}],
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            ]
        },
    )

    model: str = Field(examples=[MODEL_ID])
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int | None = Field(default=None, ge=1, le=128)
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    # Checked, then ignored: the agent's model settings come from its config.
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


@dataclass(slots=True)
class RunPlan:
    """What a chat request asks of the agent."""

    message: str
    session_id: str | None
    history: list[Message] = field(default_factory=list)
    tool_choice: str | None = None


def _refuse(message: str, param: str, code: str = "unsupported_parameter") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def _text(message: ChatMessage, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for number, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise _refuse(
                f"messages[{index}] has a {part.type!r} content part; this agent reads text only",
                f"messages[{index}].content[{number}]",
                "unsupported_content",
            )
        pieces.append(part.text)
    return "".join(pieces)


def _check_supported(body: ChatCompletionRequest) -> None:
    if body.n is not None and body.n > 1:
        raise _refuse("n must be 1: the agent gives one answer per run", "n")
    if body.tools:
        raise _refuse(
            "client-side tools are not supported: the agent runs its own tools server-side "
            "(list them in its config); send the request without 'tools'",
            "tools",
        )
    for name in ("functions", "function_call", "audio", "prediction", "web_search_options"):
        if getattr(body, name) is not None:
            raise _refuse(f"{name!r} is not supported by this agent", name)
    if body.logprobs or body.top_logprobs:
        raise _refuse("logprobs are not available from an agent's answer", "logprobs")
    if body.modalities is not None and body.modalities != ["text"]:
        raise _refuse("this agent answers in text only (modalities: ['text'])", "modalities")
    if body.response_format is not None and body.response_format.get("type") != "text":
        raise _refuse(
            "this agent answers in text; response_format must be {'type': 'text'} or left out",
            "response_format",
        )
    if body.stream_options is not None and not body.stream:
        raise _refuse(
            "stream_options is only allowed when stream is true", "stream_options", "invalid_value"
        )


def _tool_choice(choice: str | dict[str, Any] | None) -> str | None:
    if choice is None or isinstance(choice, str):
        if choice not in (None, "auto", "none", "required"):
            raise _refuse(
                "tool_choice must be 'auto', 'none', 'required' or "
                "{'type': 'function', 'function': {'name': ...}} naming one of the agent's tools",
                "tool_choice",
                "invalid_value",
            )
        return choice
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str) or not name:
        raise _refuse(
            "tool_choice as an object must be {'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
            "invalid_value",
        )
    return name


def plan_run(body: ChatCompletionRequest, session_header: str | None) -> RunPlan:
    """Check the request and map it onto a run (``OpenAIError`` for what cannot be served)."""
    _check_supported(body)
    turns: list[Message] = []
    for index, message in enumerate(body.messages):
        if message.role in ("tool", "function") or message.tool_calls or message.function_call:
            raise _refuse(
                f"messages[{index}] belongs to client-side tool calling, which this agent does "
                "not use: it runs its tools server-side",
                f"messages[{index}]",
            )
        if message.audio is not None:
            raise _refuse(f"messages[{index}] carries audio", f"messages[{index}].audio")
        text = _text(message, index)
        if message.role in ("system", "developer"):
            continue  # the agent's instructions come from its config
        role: Literal["user", "assistant"] = "user" if message.role == "user" else "assistant"
        if turns and turns[-1].role == role:
            turns[-1].content += "\n\n" + text
        else:
            turns.append(Message(role, text))
    last = body.messages[-1]
    if last.role != "user" or not turns or not turns[-1].content.strip():
        raise OpenAIError(
            400,
            "the last message must be the user's, with text: it is what the agent answers",
            param="messages",
            code="invalid_value",
        )
    session = session_header if session_header is not None else body.user
    if session is not None and not session.strip():
        param = SESSION_HEADER if session_header is not None else "user"
        raise _refuse("the session id is empty", param, "invalid_value")
    if session is not None:  # the service keeps the conversation: only the new message counts
        text = _text(last, len(body.messages) - 1)
        return RunPlan(text, session, tool_choice=_tool_choice(body.tool_choice))
    # Standing alone: the trailing user messages (joined) are the message, the rest history.
    return RunPlan(
        turns[-1].content, None, history=turns[:-1], tool_choice=_tool_choice(body.tool_choice)
    )


# -- the answer -------------------------------------------------------------------------------


def _usage(result: dict[str, Any] | None) -> dict[str, int]:
    usage = (result or {}).get("usage") or {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _finish_reason(result: dict[str, Any]) -> str:
    return "length" if result.get("loop_status") == "max_iterations" else "stop"


def _extension(run: RunView) -> dict[str, Any]:
    result = run.result or {}
    return {
        "request_id": run.request_id,
        "session_id": run.session_id,
        "status": run.status,
        "tool_calls": [
            {
                "id": call.get("id", ""),
                "name": call["name"],
                "arguments": call["arguments"],
                "result": call.get("result"),
                "status_code": call.get("status_code"),
                "error": call.get("error"),
            }
            for call in result.get("tool_calls", [])
        ],
        "approvals": result.get("approvals", []),
        "pending_approvals": run.pending_approvals,
        "warnings": result.get("warnings", []),
    }


def approval_notice(pending: dict[str, Any], *, streaming: bool) -> str:
    """What the answer says about a tool call that waits for approval."""
    after = (
        "This answer goes on once it is answered."
        if streaming
        else "The run goes on once it is answered; its answer: "
        f"GET /v1/runs/{pending['request_id']}."
    )
    return (
        f"The agent wants to run the tool {pending['tool']!r} with "
        f"{json.dumps(pending['arguments'], ensure_ascii=False)} and needs your approval. "
        f"Answer with POST /v1/approvals/{pending['approval_id']} "
        f'{{"approved": true}} (or false) before {pending["expires"]}. {after}'
    )


def _run_error(run: RunView) -> OpenAIError | None:
    """The error to answer for a run that is over without an answer (or failed inside)."""
    result = run.result
    if run.status == "completed" and result is not None:
        if result.get("loop_status") != "failed":
            return None
        status = int(result.get("status") or 500)
        return OpenAIError(
            status if status >= 400 else 500,
            str(result.get("error") or "the run failed"),
            code="run_failed",
            headers=_NO_RETRY,
        )
    status, code = _FAILED.get(run.status, (500, "run_failed"))
    return OpenAIError(status, run.error or f"the run {run.status}", code=code, headers=_NO_RETRY)


def completion_body(run: RunView, model: str) -> dict[str, Any]:
    """A ``chat.completion`` for a run that is over, or that waits for an approval."""
    pending = run.pending_approvals
    if pending and not run.done:
        content = "\n\n".join(approval_notice(p, streaming=False) for p in pending)
        finish = "stop"
    else:
        content = str((run.result or {}).get("output", ""))
        finish = _finish_reason(run.result or {})
    return {
        "id": f"chatcmpl-{run.request_id}",
        "object": "chat.completion",
        "created": int(run.created or 0),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": _usage(run.result),
        "hermes": _extension(run),
    }


class AnswerText:
    """Turns a run's text deltas into the answer's content as it streams.

    A turn that calls a tool is not the answer: its text is held back while it is only
    whitespace (the common case: a call on its own), and nothing after its first call is sent.
    Leading and trailing whitespace is held back (the answer is stripped); turns that both
    said something are separated by a blank line. ``finish`` sends whatever the final answer
    has that was not streamed (an answer from a model that did not stream, the note about an
    iteration limit), so that for a run whose tool turns say nothing but their calls, the
    streamed content is exactly the plain answer's."""

    def __init__(self) -> None:
        self.sent = ""
        self._started = False
        self._calling = False
        self._pending = ""

    def _emit(self, text: str) -> str:
        if not self._started:
            self._started = True
            if self.sent:
                text = "\n\n" + text
        self.sent += text
        return text

    def delta(self, text: str) -> str:
        """The content to send for one text delta ('' for none)."""
        if self._calling:
            return ""
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
        body = self._pending + text
        kept = body.rstrip()
        self._pending = body[len(kept) :]
        return self._emit(kept) if kept else ""

    def tool_call(self) -> None:
        """The turn calls a tool: the rest of its text is not the answer."""
        self._calling = True

    def end_turn(self) -> None:
        """The model's turn is over (a ``thought`` event)."""
        self._started = self._calling = False
        self._pending = ""

    def note(self, text: str) -> str:
        """A note of the service's own (an approval waiting), as a turn of its own."""
        self.end_turn()
        sent = self._emit(text)
        self.end_turn()
        return sent

    def finish(self, output: str) -> str:
        """What is left to send of the final answer ``output``."""
        if self.sent.endswith(output):
            return ""
        if output.startswith(self.sent):
            rest = output[len(self.sent) :]
            self.sent = output
            return rest
        self.end_turn()
        return self._emit(output)


def _frame(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else to_json(data)}\n\n"


async def completion_chunks(
    backend: RunBackend,
    principal: Principal,
    run: RunView,
    model: str,
    include_usage: bool,
    keepalive: float,
) -> AsyncIterator[str]:
    """The run as ``chat.completion.chunk`` SSE frames, then ``data: [DONE]``. The caller
    started the run listening; this stops following it when the stream ends (finished, or
    the client gone)."""
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

    answer = AnswerText()
    first = {"request_id": run.request_id, "session_id": run.session_id, "status": "running"}
    yield chunk({"role": "assistant", "content": ""}, hermes=first)
    following = await backend.events(run.request_id, principal, 0, keepalive, started=True)
    async with aclosing(following) as items:
        async for item in items:
            if item is None:
                yield KEEPALIVE_COMMENT
                continue
            _, wire = item
            kind = wire["kind"]
            text = ""
            if kind == "text_delta":
                text = answer.delta(wire["text"])
            elif kind == "tool_call_started":
                answer.tool_call()
            elif kind == "thought":
                answer.end_turn()
            elif kind == "approval_required":
                pending = {k: v for k, v in wire.items() if k != "kind"}
                note = answer.note(approval_notice(pending, streaming=True))
                yield chunk({"content": note}, hermes={"approval_required": pending})
            elif kind == "output":
                text = answer.finish(str(wire["output"]))
            if text:
                yield chunk({"content": text})
        run = await backend.view(run.request_id, principal)
        error = _run_error(run) if run.done else None
        if error is not None:
            yield _frame(error.body())
        else:
            yield chunk({}, _finish_reason(run.result or {}), hermes=_extension(run))
            if include_usage:
                yield _frame({**base, "choices": [], "usage": _usage(run.result)})
        yield _frame("[DONE]")


# -- the endpoints ----------------------------------------------------------------------------


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(BaseModel):
    """Every error of the facade."""

    error: OpenAIErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class CompletionMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["assistant"]
    content: str
    refusal: str | None = None


class CompletionChoice(BaseModel):
    index: int
    message: CompletionMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"]


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    """A ``chat.completion``; ``hermes`` is the service's extension (what ran server-side)."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: CompletionUsage
    hermes: dict[str, Any]


_ERROR_TEXT = {
    400: "The request is invalid, or asks for what the agent does not do",
    401: "No valid API key",
    404: "No such model",
    409: "The run was cancelled",
    413: "The body or the message is too large",
    422: "The agent refuses the request (an unknown tool in tool_choice)",
    429: "Over a limit or quota: retry after `Retry-After` seconds",
    500: "The run failed",
    502: "The agent's model failed",
    503: "The service is shutting down, or a store it needs cannot be reached",
    504: "The run took longer than the service allows",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    documented: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {"model": OpenAIErrorBody, "description": _ERROR_TEXT[code]}
        if code == 413:  # a body over max_body_bytes is refused before it reaches the route
            del entry["model"]
            entry["content"] = {
                "application/json": {
                    "schema": {
                        "anyOf": [
                            {"$ref": "#/components/schemas/OpenAIErrorBody"},
                            {"type": "object", "properties": {"detail": {"type": "string"}}},
                        ]
                    }
                }
            }
        if code == 429:
            entry["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
        documented[code] = entry
    return documented


def _models(request: Request) -> list[dict[str, Any]]:
    return [{"id": MODEL_ID, "object": "model", "created": _CREATED, "owned_by": "hermes-agent"}]


@router.get("/models", response_model=ModelList, responses=_errors(401))
async def list_models(request: Request, user: CurrentUser) -> Response:
    """The models this service answers as: one, the agent."""
    return JSONResponse({"object": "list", "data": _models(request)})


@router.get("/models/{model_id}", response_model=ModelCard, responses=_errors(401, 404))
async def get_model(
    model_id: Annotated[str, Path(examples=[MODEL_ID])], request: Request, user: CurrentUser
) -> Response:
    """One model, if the service answers as it."""
    return JSONResponse(_model(request, model_id, "model_id"))


def _model(request: Request, model_id: str, param: str) -> dict[str, Any]:
    for card in _models(request):
        if card["id"] == model_id:
            return card
    raise OpenAIError(
        404,
        f"The model {model_id!r} does not exist here; this service answers as {MODEL_ID!r} "
        "(GET /v1/models)",
        param=param,
        code="model_not_found",
    )


async def _seed(storage: Storage, stored: str, history: list[Message], agent: Any) -> None:
    messages = redact_messages(history, agent.redactor)  # as the agent saves its own turns
    await run_in_threadpool(storage.sessions.append, stored, messages)


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
        **_errors(400, 401, 404, 409, 413, 422, 429, 500, 502, 503, 504),
    },
)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    user: CurrentUser,
    session_header: Annotated[str | None, Header(alias=SESSION_HEADER)] = None,
) -> Response:
    """An OpenAI chat completion answered by the agent (see ``routes_openai``)."""
    state = request.app.state
    settings: ServiceSettings = state.settings
    backend: RunBackend = state.backend
    storage: Storage = state.storage
    _model(request, body.model, "model")
    plan = plan_run(body, session_header)
    session_id = plan.session_id or uuid.uuid4().hex
    stored = stored_session_id(user.user_id, session_id)
    seeded = bool(plan.history)
    if seeded:
        await _seed(storage, stored, plan.history, state.agent)
    run_request = RunRequest(
        message=plan.message,
        session_id=session_id,
        tool_choice=plan.tool_choice,
        stream=bool(body.stream),
    )
    try:
        run = await backend.start(user, run_request)
    except SessionIdError as exc:  # a session id the store cannot hold
        param = SESSION_HEADER if session_header is not None else "user"
        raise OpenAIError(400, str(exc), param=param, code="invalid_session_id") from None
    except BaseException:
        if seeded:  # the run never started: leave no half-made session behind
            await run_in_threadpool(storage.sessions.delete, stored)
        raise
    headers = {SESSION_HEADER: session_id}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        response = EventStreamResponse(
            completion_chunks(backend, user, run, body.model, include_usage, settings.keepalive_s),
            settings.send_timeout_s,
        )
        response.headers.update(headers)
        return response
    run = await backend.wait(run.request_id, user, started=True)
    error = _run_error(run) if run.done else None
    if error is not None:
        error.headers = {**(error.headers or {}), **headers}
        raise error
    return Response(
        to_json(completion_body(run, body.model)),
        media_type="application/json",
        headers=headers,
    )
