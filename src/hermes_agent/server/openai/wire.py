"""The facade's side of the OpenAI wire (the client's side is ``models.openai_request``): errors
in OpenAI's shape; the request bodies of ``/v1/chat/completions`` and ``/v1/responses`` and the
answer bodies of chat completions and ``/v1/models`` as pydantic models; and the checks both
APIs make of a request: the model it names, its content read as text, the parameters it may not
set. ``server.openai.chat`` and ``server.openai.responses`` serve them.

Requests are strict (``extra="forbid"``): a field OpenAI has and the facade does not know is
``400 unknown_parameter``, so a client never believes a setting took effect that did not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Literal

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from hermes_agent.errors import HermesAgentError
from hermes_agent.pipeline.client_tools import MAX_CLIENT_TOOLS
from hermes_agent.runs.backend import ApprovalConflict, RunNotFound
from hermes_agent.runs.gate import RunRejected
from hermes_agent.server.sse import to_json
from hermes_agent.storage.base import SessionIdError

MODEL_ID = "hermes-agent"
"""The one model the facade lists: the agent, tools and all."""
SESSION_HEADER = "X-Hermes-Session-Id"
NO_RETRY = {"x-should-retry": "false"}
"""On answers for a run that started: its tools may have run, so a blind retry is not safe."""

# -- errors in OpenAI's shape ---------------------------------------------------------------


class OpenAIError(HermesAgentError):
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
    if isinstance(exc, RunNotFound):
        return OpenAIError(404, exc.message, code=_HTTP_CODES.get(404))
    if isinstance(exc, ApprovalConflict):
        return OpenAIError(409, exc.message, code=_HTTP_CODES.get(409))
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


# -- the request ------------------------------------------------------------------------------


class Strict(BaseModel):
    """A request body, or a part of one, that refuses fields it does not declare."""

    model_config = ConfigDict(extra="forbid")


class ContentPart(BaseModel):
    """One part of a message's content; only ``{"type": "text", "text": ...}`` is served."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(Strict):
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


class FunctionDefinition(Strict):
    """A client tool's declaration: its name, what it does, and its arguments' JSON Schema."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(Strict):
    """One entry of ``tools``: a function the client runs itself."""

    type: Literal["function"]
    function: FunctionDefinition


class StreamOptions(Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ChatCompletionRequest(Strict):
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
    """An end user's id: a session only where the operator sets ``openai_user_sessions``."""
    n: int | None = Field(default=None, ge=1, le=128)
    tool_choice: str | dict[str, Any] | None = None
    tools: list[ChatTool] | None = Field(default=None, max_length=MAX_CLIENT_TOOLS)
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


class TextOptions(Strict):
    """``text`` of a Responses request: ``format`` is the answer's, as ``response_format``."""

    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ResponsesRequest(Strict):
    """The body of ``POST /v1/responses`` (see the module docstring for what is served)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"model": MODEL_ID, "input": "Hello"}]},
    )

    model: str = Field(examples=[MODEL_ID])
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_CLIENT_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = Field(default=None, max_length=100)
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    text: TextOptions | None = None
    include: list[str] | None = None
    store: bool | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    # Checked, then ignored: the agent's model settings come from its config.
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    max_tool_calls: int | None = Field(default=None, ge=1)
    truncation: Literal["auto", "disabled"] | None = None
    metadata: dict[str, str] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


# -- the answers ---------------------------------------------------------------------------


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


class CompletionFunction(BaseModel):
    name: str
    arguments: str
    """JSON text, valid against the tool's parameters schema."""


class CompletionToolCall(BaseModel):
    """A call of one of the client's tools, for the client to run."""

    id: str
    type: Literal["function"]
    function: CompletionFunction


class CompletionMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["assistant"]
    content: str | None
    refusal: str | None = None
    tool_calls: list[CompletionToolCall] | None = None


class CompletionChoice(BaseModel):
    index: int
    message: CompletionMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length", "tool_calls"]


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


def documented_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
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


def refuse(message: str, param: str, code: str = "unsupported_parameter") -> OpenAIError:
    """A 400 for what the facade does not serve, naming the parameter."""
    return OpenAIError(400, message, param=param, code=code)


# -- what both APIs check of a request --------------------------------------------------------

_CREATED = int(time.time())
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def served_models() -> list[dict[str, Any]]:
    """The models this service answers as: one, the agent."""
    return [{"id": MODEL_ID, "object": "model", "created": _CREATED, "owned_by": "hermes-agent"}]


def check_model(model_id: str, param: str) -> dict[str, Any]:
    """The model card of ``model_id``, or a 404 naming the one model there is."""
    for card in served_models():
        if card["id"] == model_id:
            return card
    raise OpenAIError(
        404,
        f"The model {model_id!r} does not exist here; this service answers as {MODEL_ID!r} "
        "(GET /v1/models)",
        param=param,
        code="model_not_found",
    )


def content_text(content: str | Sequence[ContentPart | Any] | None, where: str) -> str:
    """A message's content as text: a string, or its text parts joined (``text``, or the
    Responses API's ``input_text`` and ``output_text``); a refusal part says nothing to the
    model. Any other part (an image, a file, audio) is a 400 naming it: the agent reads text."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, Sequence):
        raise refuse(f"{where} must be text or a list of text parts", where, "invalid_value")
    pieces = []
    for number, part in enumerate(content):
        fields = part.model_dump() if isinstance(part, BaseModel) else part
        kind = fields.get("type") if isinstance(fields, Mapping) else None
        text = fields.get("text") if isinstance(fields, Mapping) else None
        if kind == "refusal":
            continue
        if kind not in _TEXT_PARTS or not isinstance(text, str):
            raise refuse(
                f"{where}[{number}] is a {kind!r} part; this agent reads text only",
                f"{where}[{number}]",
                "unsupported_content",
            )
        pieces.append(text)
    return "".join(pieces)


def check_supported(body: BaseModel, refused: Mapping[str, str]) -> None:
    """Refuse (400 ``unsupported_parameter``, naming the field) each field of ``refused`` that
    the request sets (to anything but null, false, zero or empty), with the reason given; and
    ``stream_options`` without ``stream``."""
    for name, reason in refused.items():
        if getattr(body, name):
            raise refuse(reason, name)
    if getattr(body, "stream_options", None) is not None and not getattr(body, "stream", False):
        raise refuse(
            "stream_options is only allowed when stream is true", "stream_options", "invalid_value"
        )
