"""OpenAI-compatible endpoints (vLLM, Ollama, llama.cpp server, hosted APIs) via the ``openai`` SDK.

Two modes, because servers differ in how they handle tools:

- ``hermes`` (default): the Hermes system prompt carries the tools, nothing goes in the request's
  ``tools`` field, and the reply text is parsed for ``<tool_call>`` blocks. Works with any server
  that serves a Hermes- or Qwen-style model, whatever its tool-call support.
- ``native``: tools go in ``tools`` and calls come back as structured ``tool_calls``. Local models
  sometimes still write ``<tool_call>`` text into ``content``; those calls are caught and merged.

Either way ``ModelResponse.text`` is the completion as Hermes text (native calls rendered as
``<tool_call>`` blocks), and ``stream`` yields that same text piece by piece, so parsing the joined
chunks gives the same calls as ``complete``. A server with a reasoning parser (vLLM, SGLang,
llama.cpp's server) returns a thinking model's thought in ``reasoning_content`` (or
``reasoning``) beside ``content``, in either mode: it becomes a ``<think>`` block at the start of
that text, so it is the step's thought, in the trail and the stream, and never a call (a
``</think>`` inside it is defused so that nothing in it can end the thought early).

Requests go through the SDK's lower-level ``post`` with a JSON body built in ``openai_request``
(the same JSON ``chat.completions.create`` would send, without its per-request walk over the
whole conversation; the wire form of earlier turns is reused), so a step costs about what the
HTTP round trip costs, however long the conversation. Auth headers, timeouts, retries with
backoff, error classes and response parsing stay the SDK's; what still fails afterwards is
raised as ``ModelError`` with a message that names the endpoint, quotes the server's own message
and says what to check. An empty reply (no text and no call) is a failure too, retried up to
``max_retries`` times, never passed off as an empty answer. A stream that ends before anything
arrived (llama-cpp-python's server does this when it cannot stream with tools) is retried once
without streaming, with a warning in the log. A stream is complete only when it says so: one
that ends after some of the reply but with no ``finish_reason`` and no ``[DONE]`` (a proxy or a
server that hung up mid-answer, a connection cut) is a ``ModelError``, never a short answer.
A reply that is not streamed is whole when its JSON is (a cut body does not parse).

With ``grammar=True`` in ``hermes`` mode, a request whose turn must call a tool (``tool_choice``
``required`` or a tool name) also carries a GBNF grammar built from the tools (the ``grammar``
field that llama.cpp's server and llama-cpp-python's server accept), so that call is valid by
construction there too; strings in it are bounded (256 characters) as for the embedded model.
Turns free to answer in text are not constrained.

Example::

    model = OpenAICompatible("hermes3", base_url="http://localhost:11434/v1")  # Ollama
    response = await model.complete(messages, tools, ModelSettings())
    response.completion.tool_calls  # [ToolCall(name="get_weather", arguments={...}, id=...)]
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, TypeVar
from weakref import WeakKeyDictionary

from openai import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AsyncOpenAI,
    AsyncStream,
)
from openai._streaming import ServerSentEvent

from hermes_agent.errors import ConfigError, ModelError
from hermes_agent.models import openai_reply as json_reply
from hermes_agent.models.base import (
    ModelBase,
    ModelProfile,
    ModelSettings,
    ToolChoiceEnforcement,
    grammar_tool_choice,
)
from hermes_agent.models.openai_render import StreamedCalls, StreamedThought, merge_native
from hermes_agent.models.openai_reply import JSON
from hermes_agent.models.openai_request import WireCache, native_tool_choice
from hermes_agent.models.profiles import ThoughtCalls, thought_policy
from hermes_agent.protocol.chatml import (
    CHAT_FORMATS,
    to_json,
)
from hermes_agent.protocol.grammar import build_grammar
from hermes_agent.types import (
    Message,
    ModelResponse,
    StreamChunk,
    Usage,
)

_T = TypeVar("_T")
_MAX_BACKOFF_S = 8.0  # the SDK's longest wait between two attempts (openai._constants)
Mode = Literal["native", "hermes"]
MODES: tuple[Mode, ...] = ("native", "hermes")
Transport = Literal["httpx", "aiohttp"]
TRANSPORTS: tuple[Transport, ...] = ("httpx", "aiohttp")

# Local servers accept any key, but the SDK refuses to start without one.
_PLACEHOLDER_API_KEY = "not-needed"
_PATH = "/chat/completions"
# What ``create()`` asks of the SDK besides the body: the API key as a bearer token (and no
# other credential the client may hold). Older SDKs have no such option (they keep unknown ones
# aside) and send the bearer token anyway; hence ``Any`` rather than their ``RequestOptions``.
_OPTIONS: Any = {"security": {"bearer_auth": True}}
_EXCERPT_HEAD = 240
_EXCERPT_TAIL = 480
logger = logging.getLogger("hermes_agent")


class OpenAICompatible(ModelBase):
    """A model behind an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    ``temperature`` and ``max_tokens`` are defaults that ``ModelSettings`` overrides per request.
    ``timeout`` (seconds per attempt) and ``max_retries`` go to the SDK, which retries connection
    errors, timeouts, 408/409/429 and 5xx answers with exponential backoff. The SDK's timeout
    bounds each read, so an endpoint that trickles a byte at a time would never trip it:
    ``deadline`` bounds a whole request — its retries, and a stream to its last chunk — and
    defaults to what every attempt may take — ``timeout × (max_retries + 1)``, plus the SDK's
    longest backoff (8 s) between attempts and a second — so a timeout of one attempt is
    reported as such first; past it the request is ``ModelError``. Pass
    ``client`` to use a configured ``AsyncOpenAI`` as is (``base_url``, ``api_key``, ``timeout``
    and ``max_retries`` are then ignored; ``deadline`` still holds). In ``native`` mode
    ``chat_format`` and the scratch-pad setting do not apply: the server's own chat template
    renders the conversation.
    ``extra_body`` holds request fields the model does not set itself (``seed``, ``top_p``,
    ``stop``, ``response_format``, a server's own such as ``min_p``); they go into every request
    as they are and win over the model's own.

    The model keeps one SDK client per event loop, so one instance serves both a long-lived
    async server and the sync facade (one event loop per thread, and a helper thread's own loop
    when called from async code); ``aclose()`` releases the current loop's connections early.

    ``transport`` is the SDK's HTTP client: ``httpx`` (its default, httpx2) or ``aiohttp`` (the
    ``aiohttp`` extra; the SDK's ``DefaultAioHttpClient``), which costs the process less CPU
    per request under load (docs/benchmarks.md). An aiohttp session must be closed on the loop
    that opened it: the service, the worker and ``Agent.close`` (for the sync facade's loop)
    do so; a program that runs the model on a loop of its own awaits ``aclose()`` before that
    loop ends, or aiohttp logs "Unclosed client session".

    Example::

        model = OpenAICompatible("qwen2.5:7b", base_url="http://localhost:11434/v1", mode="native")
        response = asyncio.run(model.complete([Message("user", "Hi")], [], ModelSettings()))
        print(response.text)
    """

    def __init__(
        self,
        model_name: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        mode: Mode = "hermes",
        chat_format: str = "hermes",
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        deadline: float | None = None,
        client: AsyncOpenAI | None = None,
        context_window: int | None = None,
        grammar: bool = False,
        extra_body: Mapping[str, Any] | None = None,
        transport: Transport = "httpx",
        thought_calls: ThoughtCalls | None = None,
        opens_thought: bool | None = None,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
        if transport not in TRANSPORTS:
            raise ConfigError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        if transport == "aiohttp" and client is None:
            _check_aiohttp()
        if chat_format not in CHAT_FORMATS:
            raise ConfigError(f"chat_format must be one of {CHAT_FORMATS}, got {chat_format!r}")
        self.name = model_name
        self.mode: Mode = mode
        # The server applies the model's own chat template: the family's policy holds
        # (None: found by name when asked) unless overridden here.
        self.thought = (
            None
            if thought_calls is None and opens_thought is None
            else thought_policy(
                model_name, thought_calls=thought_calls, opens_thought=opens_thought
            )
        )
        self.chat_format = chat_format
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.deadline = (
            deadline if deadline is not None else _default_deadline(timeout, max_retries)
        )
        """Seconds one request may take in all (see the class docstring)."""
        if not self.deadline > 0:
            raise ConfigError(f"deadline must be a positive number of seconds, got {deadline!r}")
        self.context_window = context_window
        """The endpoint model's context size in tokens; when set, prompts are fitted to it."""
        self.grammar = grammar
        """hermes mode: send a GBNF grammar of the tool calls (llama.cpp servers)."""
        self.extra_body: dict[str, Any] = dict(extra_body or {})
        """Fields added to every request body as they are, over the ones the model sets."""
        self._wire = WireCache()
        self.transport: Transport = transport
        """The SDK's HTTP client (see the class docstring); a ``client`` given keeps its own."""
        self._given_client = client
        self._client_options: dict[str, Any] = {
            "base_url": base_url,
            "api_key": api_key or os.environ.get("OPENAI_API_KEY") or _PLACEHOLDER_API_KEY,
            "timeout": timeout,
            "max_retries": max_retries,
        }
        # One client per event loop: pooled connections belong to the loop that opened them, and
        # the sync facade may run turns on more than one loop (one per thread).
        self._clients: WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncOpenAI] = (
            WeakKeyDictionary()
        )
        self._unbound: AsyncOpenAI | None = client or self._new_client()
        self.base_url = str(self._unbound.base_url)
        """The endpoint requests go to (the SDK's default when none was given)."""

    @property
    def profile(self) -> ModelProfile:
        # An endpoint model can summarise old turns; its tokenizer is not ours to call, so
        # token counts are ModelBase's estimate.
        enforcement: ToolChoiceEnforcement = "server" if self.mode == "native" else "prompt"
        if self.mode == "hermes" and self.grammar:
            enforcement = "grammar"
        return ModelProfile(
            context_window=self.context_window,
            max_tokens=self.max_tokens,
            can_summarize=True,
            tool_choice_enforcement=enforcement,
            provider="openai",
            server_url=self.base_url,
            thought=self.thought,
        )

    def _client(self) -> AsyncOpenAI:
        if self._given_client is not None:
            return self._given_client
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._unbound or self._new_client()
            self._unbound = None
            self._clients[loop] = client
        return client

    def _new_client(self) -> AsyncOpenAI:
        if self.transport == "aiohttp":
            # Its aiohttp session is opened by the first request, on the loop that sends it.
            from openai import DefaultAioHttpClient

            return AsyncOpenAI(**self._client_options, http_client=DefaultAioHttpClient())
        return AsyncOpenAI(**self._client_options)

    async def aclose(self) -> None:
        """Close the connections this model opened on the running event loop (optional: a
        long-lived server calls it on shutdown; a client passed in is left to its owner)."""
        loop = asyncio.get_running_loop()
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.close()

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> ModelResponse:
        """Send the conversation, wait for the whole reply, and parse it (within ``deadline``)."""
        deadline = asyncio.timeout(self.deadline)
        try:
            async with deadline:
                return await self._complete(messages, tools, settings)
        except TimeoutError:
            if deadline.expired():
                raise self._past_deadline() from None
            raise

    async def _complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> ModelResponse:
        body = self._body(messages, tools, settings, stream=False)
        usage = Usage()
        for attempt in range(self.max_retries + 1):
            try:
                # The reply's JSON as decoded, not the SDK's models (``openai_reply``).
                data = await self._client().post(_PATH, body=body, cast_to=object, options=_OPTIONS)
            except APIError as exc:
                raise self._model_error(exc) from exc
            except json.JSONDecodeError as exc:  # a JSON body that stops short
                raise self._cut_short(exc) from exc
            response = self._reply(data)
            choice = json_reply.first_choice(response)
            message = json_reply.part(choice, "message")
            content = json_reply.content(message)
            # Structured calls are read in hermes mode too: some servers parse the text for us.
            native = json_reply.tool_calls(message)
            usage.add(_usage(response.get("usage")))
            ending = json_reply.text(choice, "finish_reason")
            if ending in _FAILED:
                raise self._failed_mid_answer(ending)
            if content.strip() or native:
                reasoning = json_reply.reasoning(message)
                completion, text = merge_native(content, native, reasoning)
                return ModelResponse(
                    completion=completion,
                    text=text,
                    usage=usage,
                    model_name=json_reply.text(response, "model")[:200] or self.name,
                    finish_reason=ending[:40],
                )
            finish = (
                "no choices" if choice is None else json_reply.text(choice, "finish_reason")[:40]
            ) or "none"
            logger.warning(
                "%s returned an empty reply (finish_reason=%s, attempt %d of %d)",
                self._where(), finish, attempt + 1, self.max_retries + 1,
            )  # fmt: skip
        raise ModelError(
            f"{self._where()} returned an empty reply (no text and no tool call; finish_reason="
            f"{finish}, {_attempts(self.max_retries + 1)}). Check the server's logs; a model that "
            "stops at once may need a different chat template or a larger max_tokens."
        )

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> AsyncIterator[StreamChunk]:
        """Yield the reply as Hermes text while it arrives; the last chunk carries usage.

        A stream that ends before anything arrived is asked again without streaming (some
        servers answer 200 and then abort a stream they cannot produce, such as llama-cpp-
        python's with tools and ``tool_choice: auto``)."""
        body = self._body(messages, tools, settings, stream=True)
        calls = StreamedCalls()
        thought = StreamedThought()
        usage = Usage(requests=1)
        received = False
        finish = ""  # the server's finish_reason, once it sends one
        # One deadline for the request and every chunk of it (each await is bounded by it;
        # never a timeout across a ``yield``, which would land in the consumer's code).
        when = asyncio.get_running_loop().time() + self.deadline
        try:
            async with asyncio.timeout_at(when):
                # Each chunk's JSON as decoded, not the SDK's models (``openai_reply``).
                stream = await self._client().post(
                    _PATH,
                    body=body,
                    cast_to=object,
                    options=_OPTIONS,
                    stream=True,
                    stream_cls=_Stream,
                )
            try:
                async for data in _before(when, stream):
                    chunk = self._reply(data)
                    if chunk.get("usage") is not None:
                        usage = _usage(chunk["usage"])
                    choice = json_reply.first_choice(chunk)
                    if choice is None:
                        continue
                    finish = json_reply.text(choice, "finish_reason") or finish
                    delta = json_reply.part(choice, "delta")
                    reasoning = json_reply.reasoning(delta)
                    content = json_reply.content(delta)
                    call_deltas = json_reply.tool_calls(delta)
                    received = received or bool(content.strip() or call_deltas or reasoning.strip())
                    if reasoning:
                        text = calls.finish() + thought.feed(reasoning)
                        calls.wrote(text)
                        yield StreamChunk(text)
                    if content:
                        # Text after a native call would land inside its tags: close it first.
                        text = thought.finish() + calls.finish() + content
                        calls.wrote(text)
                        yield StreamChunk(text)
                    for call_delta in call_deltas:
                        text = thought.finish() + calls.feed(call_delta)
                        if text:
                            yield StreamChunk(text)
            finally:
                await stream.close()
        except APIError as exc:
            raise self._model_error(exc) from exc
        except json.JSONDecodeError as exc:  # an event whose JSON stops short
            raise self._cut_short(exc) from exc
        except TimeoutError:
            if asyncio.get_running_loop().time() >= when:
                raise self._past_deadline() from None
            raise
        if not received:
            logger.warning(
                "%s ended the stream without a reply%s; asking again without streaming",
                self._where(), " (it may not stream tool calls)" if tools else "",
            )  # fmt: skip
            response = await self.complete(messages, tools, settings)
            response.usage.add(usage)
            yield StreamChunk(response.text)
            yield StreamChunk("", usage=response.usage, finish_reason=response.finish_reason)
            return
        if not (finish or stream.done):
            raise self._cut_short()
        if finish in _FAILED:
            raise self._failed_mid_answer(finish)
        tail = thought.finish() + calls.finish()
        if tail:
            yield StreamChunk(tail)
        yield StreamChunk("", usage=usage, finish_reason=finish[:40])

    def render_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> str:
        """The request body as ``complete`` sends it (JSON), for the audit trail."""
        body = self._body(messages, tools, settings, stream=False)
        return json.dumps(body, ensure_ascii=False, default=str)

    # -- request --------------------------------------------------------------------------------

    def _body(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
        *,
        stream: bool,
    ) -> dict[str, Any]:
        """The JSON body of one request: what ``chat.completions.create`` would send for the
        same arguments, built without the SDK's per-request transform (see ``openai_request``)."""
        body: dict[str, Any] = {"model": self.name}
        choice = settings.tool_choice
        if self.mode == "hermes":
            body["messages"] = self._wire.hermes(
                messages,
                tools,
                chat_format=self.chat_format,
                scratch_pad=settings.scratch_pad,
                tool_choice=choice,
                preamble=settings.preamble,
            )
        else:
            body["messages"] = self._wire.native(messages)
            if tools:
                body["tools"] = list(tools)
                body["tool_choice"] = native_tool_choice(choice)
        if self.mode == "hermes" and self.grammar and tools and choice not in ("auto", "none"):
            # Only a turn that must call is constrained: the grammar's bounds on free text
            # (length, a leading "<") suit the embedded model, not an endpoint's answers.
            grammar = self._wire.for_tools(
                ("grammar", choice, settings.scratch_pad),
                tools,
                lambda: build_grammar(tools, tool_choice=choice, scratch_pad=settings.scratch_pad),
            )
            if grammar is not None:
                body["grammar"] = grammar  # not an OpenAI field; llama.cpp servers read it
        self._answer_format(body, messages, tools, settings)
        temperature = settings.temperature if settings.temperature is not None else self.temperature
        if temperature is not None:
            body["temperature"] = temperature
        max_tokens = settings.max_tokens if settings.max_tokens is not None else self.max_tokens
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        body["stream"] = stream
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.extra_body:
            body.update(self.extra_body)
        return body

    def _answer_format(
        self,
        body: dict[str, Any],
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> None:
        """Structured output (``settings.output_schema``) as the server can hold the answer to
        it. ``hermes`` mode with ``grammar``: one GBNF grammar that admits exactly a valid
        call or JSON of the schema (``protocol.grammar``'s answer branch), for a turn free
        to answer; with tool results in hand, the JSON alone (``grammar_tool_choice``, as the
        embedded model has it). Otherwise, a turn that cannot call (no tools offered) asks
        for ``response_format`` ``json_schema``; a turn that may call is held to the schema by
        the prompt and the pipeline's check only: servers apply a response format to the
        whole reply (vLLM's guided decoding, Ollama's ``format``), which would forbid the
        calls, and llama-cpp-python's ``chatml-function-calling`` ignores it there."""
        schema = settings.output_schema
        if schema is None or "grammar" in body or settings.tool_choice not in ("auto", "none"):
            return
        if self.mode == "hermes" and self.grammar:
            choice = grammar_tool_choice(messages, settings)
            offered = list(tools) if choice == "auto" else []
            body["grammar"] = build_grammar(
                offered,
                tool_choice="auto" if offered else "none",
                scratch_pad=settings.scratch_pad,
                answer_schema=schema,
            )
        elif not tools or settings.tool_choice == "none":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema},
            }

    # -- errors ---------------------------------------------------------------------------------

    def _reply(self, data: object) -> JSON:
        """The reply (or a chunk of a stream) as a JSON object, or ``ModelError``."""
        found = json_reply.as_object(data)
        if found is not None:
            return found
        raise ModelError(
            f"{self._where()} answered with {json_reply.describe(data)} instead of a chat "
            "completion. Check that `base_url` points at an OpenAI-compatible API (often "
            ".../v1), not a web page or a proxy's error page."
        )

    def _where(self) -> str:
        return f"The model endpoint at {self.base_url.rstrip('/')} (model {self.name!r})"

    def _past_deadline(self) -> ModelError:
        return ModelError(
            f"{self._where()} did not finish the request within its deadline of "
            f"{self.deadline:g} s (the whole request: retries, and a stream to its last chunk). "
            "The server may be overloaded or trickling its answer; raise `deadline` (by default "
            "what every attempt may take) for models that answer slowly at length."
        )

    def _cut_short(self, cut: json.JSONDecodeError | None = None) -> ModelError:
        how = (
            "(no finish_reason and no [DONE])"
            if cut is None
            else f"(its JSON stops at character {cut.pos}: {cut.msg})"
        )
        return ModelError(
            f"{self._where()} ended its reply before it was complete {how}: the answer was "
            "cut short and was not used. A proxy or load balancer may have closed the "
            "connection, or the server stopped mid-answer; check its logs and any proxy's "
            "timeouts."
        )

    def _failed_mid_answer(self, finish: str) -> ModelError:
        return ModelError(
            f"{self._where()} ended its reply with finish_reason={finish!r}: it failed "
            "mid-answer, so the reply is incomplete and was not used. Check the server's logs."
        )

    def _model_error(self, exc: APIError) -> ModelError:
        url = self.base_url.rstrip("/")
        where = self._where()
        if isinstance(exc, APITimeoutError) and not _refused(exc):
            return ModelError(
                f"{where} did not answer within {self.timeout:g} s "
                f"({_attempts(self.max_retries + 1)}). Is the server running and not overloaded? "
                "Raise `timeout` for slow models."
            )
        if isinstance(exc, APIConnectionError):
            reason = _excerpt(str(exc.__cause__ or exc)).rstrip(".") or type(exc).__name__
            return ModelError(
                f"Could not connect to the model endpoint at {url} ({reason}, "
                f"{_attempts(self.max_retries + 1)}). Is the server running at {url}? "
                "Check `base_url` (it usually ends in /v1)."
            )
        if isinstance(exc, APIStatusError):
            body = exc.body if exc.body is not None else exc.response.text
            return ModelError(
                f"{where} answered HTTP {exc.status_code}: {_excerpt(_server_message(body))}. "
                f"{_status_hint(exc.status_code)}"
            )
        return ModelError(f"{where} failed: {_excerpt(str(exc))}. Check the server's logs.")


def _refused(exc: BaseException) -> bool:
    """Whether a timeout the SDK reports was a connection that failed without timing out: the
    aiohttp transport reports every ``aiohttp.ClientConnectionError`` (a refused connection,
    a server that hung up) as a connect timeout, with the aiohttp error as its cause."""
    try:
        from aiohttp import ClientConnectionError, ServerTimeoutError
    except ImportError:  # httpx reports timeouts as timeouts
        return False
    seen = 0
    cause = exc.__cause__ or exc.__context__
    while cause is not None and seen < 8:
        if isinstance(cause, TimeoutError | ServerTimeoutError):
            return False
        if isinstance(cause, ClientConnectionError | OSError):
            return True
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return False


def aiohttp_available() -> bool:
    """Whether the SDK can send its requests through aiohttp (``transport="aiohttp"``)."""
    return _aiohttp_problem() is None


def _check_aiohttp() -> None:
    """``ConfigError`` unless the SDK can send its requests through aiohttp."""
    problem = _aiohttp_problem()
    if problem is not None:
        raise ConfigError(
            f"transport: aiohttp needs aiohttp and an openai SDK that can use it ({problem}); "
            "install hermes-agent-core[aiohttp], or use transport: httpx"
        )


@functools.cache
def _aiohttp_problem() -> str | None:
    """Why the SDK cannot use aiohttp in this process (``None``: it can); asked once, since
    what is installed does not change while the process runs."""
    try:
        import aiohttp  # noqa: F401
        from openai import DefaultAioHttpClient

        # Older SDKs import it without their aiohttp transport and refuse only when it is
        # made (RuntimeError); made here, it opens nothing (its session waits for a request).
        DefaultAioHttpClient()
    except (ImportError, RuntimeError) as exc:
        return str(exc)
    return None


def _default_deadline(timeout: float, max_retries: int) -> float:
    return timeout * (max_retries + 1) + _MAX_BACKOFF_S * max_retries + 1.0


_FAILED = frozenset({"error", "abort"})
"""Finish reasons that say the server gave up mid-answer (OpenRouter's ``error``, vLLM's
``abort``): the stream ended, but not with a reply."""


class _Stream(AsyncStream[object]):
    """The SDK's stream, noting whether the server sent ``[DONE]`` (the SDK ends the
    iteration there, and just the same when the connection closes without it)."""

    done = False

    async def _iter_events(self) -> AsyncIterator[ServerSentEvent]:
        async for event in super()._iter_events():
            if event.data.startswith("[DONE]"):
                self.done = True
            yield event


async def _before(when: float, items: AsyncIterator[_T]) -> AsyncIterator[_T]:
    """``items`` while the loop's clock is before ``when``; ``TimeoutError`` after it, even
    while an item is awaited (an endpoint that trickles it a byte at a time)."""
    iterator = aiter(items)
    while True:
        try:
            async with asyncio.timeout_at(when):
                item = await anext(iterator)
        except StopAsyncIteration:
            return
        yield item


# -- small helpers --------------------------------------------------------------------------------


def _usage(usage: object) -> Usage:
    return Usage(
        prompt_tokens=json_reply.count(usage, "prompt_tokens"),
        completion_tokens=json_reply.count(usage, "completion_tokens"),
        requests=1,
    )


def _attempts(count: int) -> str:
    return f"{count} attempt" + ("" if count == 1 else "s")


def _server_message(body: Any) -> Any:
    """The server's own message from an error body (OpenAI's ``{"error": {"message"}}``,
    llama-cpp-python's ``{"message"}``, FastAPI's ``{"detail"}``), else the body."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"] if error["message"].strip() else error
        for key in ("message", "detail", "error"):
            if isinstance(body.get(key), str) and body[key].strip():
                return body[key]
    return body  # no message of its own: the whole body says more than an empty string


def _excerpt(body: Any) -> str:
    """One line of at most about 700 characters; when cut, the start and the end are kept
    (the cause of a failure is often in its last line)."""
    text = body if isinstance(body, str) else to_json(body)
    text = " ".join(text.split())
    if len(text) <= _EXCERPT_HEAD + _EXCERPT_TAIL:
        return text
    return f"{text[:_EXCERPT_HEAD]} … {text[-_EXCERPT_TAIL:]}"


def _status_hint(status: int) -> str:
    if status in (401, 403):
        return "Check `api_key` (or OPENAI_API_KEY) for this endpoint."
    if status == 404:
        return "Check the model name and that `base_url` points at the API root (often .../v1)."
    if status == 429:
        return "The endpoint is rate-limiting; retry later or raise `max_retries`."
    if status >= 500:
        return "The server failed; check its logs and that the model is loaded."
    return "Check the request settings (model name, max_tokens, tool definitions)."
