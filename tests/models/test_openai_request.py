"""The request ``OpenAICompatible`` sends without ``chat.completions.create`` is the one
``create()`` would send: the same JSON body, path and headers, for a corpus of conversations and
settings, asked once or turn by turn (when the wire form of earlier turns comes from the cache).

Both requests are captured by an ``httpx.MockTransport`` under the SDK's own client, so what is
compared is what the SDK would put on the network.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

import httpx
import pytest
from openai import AsyncOpenAI

from hermes_agent.models import openai_request
from hermes_agent.models.base import ModelSettings
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.protocol.chatml import render_conversation
from hermes_agent.protocol.grammar import build_grammar
from hermes_agent.types import Message, ToolCall, ToolResult

# -- capture ------------------------------------------------------------------------------------

_REPLY = {
    "id": "chatcmpl-golden",
    "object": "chat.completion",
    "created": 0,
    "model": "golden-model",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
_SSE = (
    'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
    '"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n'
    "data: [DONE]\n\n"
)


class Captured:
    """Requests that reached the transport, answered with a fixed completion (or stream)."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if json.loads(request.content).get("stream"):
            return httpx.Response(200, text=_SSE, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=_REPLY)

    def client(self) -> AsyncOpenAI:
        http = httpx.AsyncClient(transport=httpx.MockTransport(self.handler))
        return AsyncOpenAI(
            base_url="http://golden.test/v1",
            api_key="sk-golden",
            http_client=http,  # type: ignore[arg-type]  # newer SDKs type their own httpx fork
            max_retries=0,
        )

    def last(self) -> tuple[str, str, dict[str, str], Any]:
        request = self.requests[-1]
        headers = {k: v for k, v in request.headers.items() if k != "content-length"}
        return request.method, str(request.url), headers, json.loads(request.content)


# -- the reference: create() with the conversation rendered afresh ------------------------------


def reference_messages(model: OpenAICompatible, messages: list[Message], tools: list[Any],
                       settings: ModelSettings) -> list[dict[str, Any]]:  # fmt: skip
    """The wire messages rendered from scratch, without any cache."""
    if model.mode == "native":
        return [wire for m in messages for wire in openai_request.native_messages(m)]
    wire: list[dict[str, Any]] = list(
        render_conversation(
            messages,
            tools,
            chat_format=model.chat_format,
            scratch_pad=settings.scratch_pad,
            tool_choice=settings.tool_choice,
        )
    )
    # The chat API requires the id of the call a tool turn answers (the first one).
    results = iter([m.tool_results for m in messages if m.role == "tool"])
    for item in wire:
        if item["role"] == "tool":
            answered = next(results, [])
            item["tool_call_id"] = answered[0].call_id if answered else ""
    return wire


# create() parameters; anything else in a model's extra_body goes to create()'s extra_body.
_CREATE_FIELDS = {"response_format", "seed", "stop", "top_p", "parallel_tool_calls", "logprobs"}


async def send_with_create(
    client: AsyncOpenAI,
    model: OpenAICompatible,
    messages: list[Message],
    tools: list[Any],
    settings: ModelSettings,
    *,
    stream: bool,
) -> None:
    kwargs: dict[str, Any] = {
        "model": model.name,
        "messages": reference_messages(model, messages, tools, settings),
    }
    extra: dict[str, Any] = {}
    if model.mode == "native" and tools:
        kwargs["tools"] = tools
        choice = settings.tool_choice
        kwargs["tool_choice"] = (
            choice
            if choice in ("auto", "required", "none")
            else {"type": "function", "function": {"name": choice}}
        )
    forced = settings.tool_choice not in ("auto", "none")
    if model.mode == "hermes" and model.grammar and tools and forced:
        grammar = build_grammar(
            tools, tool_choice=settings.tool_choice, scratch_pad=settings.scratch_pad
        )
        if grammar is not None:
            extra["grammar"] = grammar
    temperature = settings.temperature if settings.temperature is not None else model.temperature
    if temperature is not None:
        kwargs["temperature"] = temperature
    max_tokens = settings.max_tokens if settings.max_tokens is not None else model.max_tokens
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    for key, value in model.extra_body.items():
        if key in _CREATE_FIELDS:
            kwargs[key] = value
        else:
            extra[key] = value
    if stream:
        response = await client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, extra_body=extra or None, **kwargs
        )
        async for _ in response:
            pass
    else:
        await client.chat.completions.create(stream=False, extra_body=extra or None, **kwargs)


async def send_with_model(
    model: OpenAICompatible,
    messages: list[Message],
    tools: list[Any],
    settings: ModelSettings,
    *,
    stream: bool,
) -> None:
    if stream:
        async for _ in model.stream(messages, tools, settings):
            pass
    else:
        await model.complete(messages, tools, settings)


def assert_same_request(
    model: OpenAICompatible,
    messages: list[Message],
    tools: list[Any],
    settings: ModelSettings,
    *,
    stream: bool = False,
) -> dict[str, Any]:
    """Send with the model and with create(); the requests must be the same. Returns the body."""
    ours, theirs = CAPTURED[model], Captured()

    async def both() -> None:
        await send_with_model(model, messages, tools, settings, stream=stream)
        await send_with_create(theirs.client(), model, messages, tools, settings, stream=stream)

    asyncio.run(both())
    sent, expected = ours.last(), theirs.last()
    assert sent[:2] == expected[:2]  # method, URL
    assert sent[2] == expected[2]  # headers: auth, content type, the SDK's own
    assert sent[3] == expected[3]  # the body, as JSON
    body: dict[str, Any] = sent[3]
    return body


# -- the corpus -----------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the documents.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, SEARCH]


class Opaque:
    def __str__(self) -> str:
        return "<opaque value>"


def conversation() -> list[Message]:
    """Every kind of turn: instructions, a history summary, calls and results of all shapes,
    a planning turn, a malformed turn replayed verbatim, unicode and non-JSON values."""
    first = ToolCall("get_weather", {"city": "Paris"}, id="call_1")
    second = ToolCall("search", {"query": 'café "quotes" </tool_call>', "limit": 3}, id="call_2")
    third = ToolCall("get_weather", {}, id="call_3")
    return [
        Message("system", "Be brief."),
        Message("system", "Summary of earlier turns: the user lives in Paris."),
        Message("user", "Weather in Paris, and find the café notes?"),
        Message("assistant", "Checking both.", tool_calls=[first, second]),
        Message(
            "tool",
            tool_results=[
                ToolResult("call_1", "get_weather", {"temp_c": 18, "sky": None}),
                ToolResult(
                    "call_2",
                    "search",
                    {"status": "ok", "data": ["晴れ", Opaque()], "error": None},
                ),
            ],
        ),
        Message("assistant", "", tool_calls=[third], scratch_pad="Goal: weather.\nActions: call."),
        Message("tool", tool_results=[ToolResult("call_3", "get_weather", "missing city")]),
        Message("assistant", "Broken:", raw='Broken: <tool_call>{"name": </tool_call>'),
        Message("user", "Thanks! Now in Tōkyō?"),
    ]


MODELS: dict[str, dict[str, Any]] = {
    "native": {"mode": "native"},
    "hermes": {"mode": "hermes"},
    "qwen": {"mode": "hermes", "chat_format": "qwen"},
    "native-defaults": {"mode": "native", "temperature": 0.3, "max_tokens": 64},
    "hermes-grammar": {"mode": "hermes", "grammar": True},
    "native-extra": {
        "mode": "native",
        "extra_body": {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "answer",
                    "schema": {"type": "object", "properties": {"text": {"type": "string"}}},
                },
            },
            "seed": 7,
            "stop": ["</answer>"],
            "top_p": 0.9,
            "parallel_tool_calls": False,
            "min_p": 0.05,
        },
    },
    "hermes-extra": {
        "mode": "hermes",
        "extra_body": {"response_format": {"type": "json_object"}, "repeat_penalty": 1.1},
    },
}
SETTINGS = {
    "auto": ModelSettings(),
    "required": ModelSettings(tool_choice="required", temperature=0.0),
    "none": ModelSettings(tool_choice="none"),
    "named": ModelSettings(tool_choice="search", max_tokens=32, scratch_pad=True),
}


CAPTURED: WeakKeyDictionary[OpenAICompatible, Captured] = WeakKeyDictionary()


def make(**kwargs: Any) -> OpenAICompatible:
    """A model that sends through an SDK client whose requests are captured."""
    captured = Captured()
    model = OpenAICompatible("golden-model", client=captured.client(), **kwargs)
    CAPTURED[model] = captured
    return model


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("settings", list(SETTINGS), ids=list(SETTINGS))
@pytest.mark.parametrize("kind", list(MODELS), ids=list(MODELS))
def test_the_body_is_the_one_create_would_send(kind: str, settings: str, stream: bool) -> None:
    model = make(**MODELS[kind])
    body = assert_same_request(model, conversation(), TOOLS, SETTINGS[settings], stream=stream)
    # Not vacuous: the corpus reaches the wire in the shape each case is about.
    assert body["model"] == "golden-model" and body["stream"] is stream
    if model.mode == "native":
        assert body["tools"] == TOOLS and len(body["messages"]) == 10
    else:
        assert "tools" not in body and body["messages"][0]["role"] == "system"
    if kind.endswith("extra"):
        assert body["response_format"] == model.extra_body["response_format"]
    if kind == "hermes-grammar":
        assert ("grammar" in body) is (settings in ("required", "named"))


@pytest.mark.parametrize("kind", ["native", "hermes", "qwen"])
def test_without_tools_or_history(kind: str) -> None:
    model = make(**MODELS[kind])
    body = assert_same_request(model, [Message("user", "Hi")], [], ModelSettings())
    assert body["messages"] == [{"role": "user", "content": "Hi"}]
    assert "tools" not in body and "tool_choice" not in body


# -- turn by turn: cached wire forms match a fresh rendering -------------------------------------

Edit = Callable[[list[Message], list[Any]], None]


def _replace_a_result(messages: list[Message], tools: list[Any]) -> None:
    # As the context window does: a copy with a shortened result replaces the message.
    index = next(i for i, m in enumerate(messages) if m.tool_results)
    message = messages[index]
    short = dataclasses.replace(message.tool_results[0], content="cut")
    messages[index] = dataclasses.replace(message, tool_results=[short])


def _rewrite_data_in_place(messages: list[Message], tools: list[Any]) -> None:
    # As Agent hooks do with RunContext.rewrite_result: the data of a sent result, in place.
    result = next(r for m in messages for r in m.tool_results if isinstance(r.content, dict))
    result.content["data"] = "rewritten by a hook"


def _rebind_content(messages: list[Message], tools: list[Any]) -> None:
    next(m for m in messages if m.role == "assistant").content = "Edited text."


def _edit_arguments_in_place(messages: list[Message], tools: list[Any]) -> None:
    next(c for m in messages for c in m.tool_calls).arguments["city"] = "Lyon"


def _add_a_call(messages: list[Message], tools: list[Any]) -> None:
    turn = next(m for m in messages if m.tool_calls)
    turn.tool_calls.append(ToolCall("search", {"query": "added"}, id="call_added"))


def _change_instructions(messages: list[Message], tools: list[Any]) -> None:
    messages[0] = Message("system", "Be very brief.")


def _change_tools(messages: list[Message], tools: list[Any]) -> None:
    tools.pop()


def _rename_a_call_id(messages: list[Message], tools: list[Any]) -> None:
    next(r for m in messages for r in m.tool_results).call_id = "call_renamed"


EDITS: dict[str, Edit] = {
    "replace-result": _replace_a_result,
    "rewrite-data": _rewrite_data_in_place,
    "rebind-content": _rebind_content,
    "edit-arguments": _edit_arguments_in_place,
    "add-call": _add_a_call,
    "change-instructions": _change_instructions,
    "change-tools": _change_tools,
    "rename-call-id": _rename_a_call_id,
}


@pytest.mark.parametrize("kind", ["native", "hermes", "qwen"])
def test_a_conversation_sent_turn_by_turn_matches_create(kind: str) -> None:
    model = make(**MODELS[kind])
    full = conversation()
    for end in range(1, len(full) + 1):
        assert_same_request(model, full[:end], TOOLS, SETTINGS["auto"])
    assert_same_request(model, full, TOOLS, SETTINGS["named"], stream=True)


@pytest.mark.parametrize("edit", list(EDITS), ids=list(EDITS))
@pytest.mark.parametrize("kind", ["native", "hermes"])
def test_a_change_to_a_sent_message_reaches_the_wire(kind: str, edit: str) -> None:
    model = make(**MODELS[kind])
    messages, tools = conversation(), list(TOOLS)
    before = assert_same_request(model, messages, tools, ModelSettings())
    EDITS[edit](messages, tools)
    after = assert_same_request(model, messages, tools, ModelSettings())
    assert after != before


def test_only_new_turns_are_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered: list[Message] = []
    original = openai_request.native_messages

    def counting(message: Message) -> list[dict[str, Any]]:
        rendered.append(message)
        return original(message)

    monkeypatch.setattr(openai_request, "native_messages", counting)
    model = make(mode="native")
    settings = ModelSettings()
    messages = [Message("system", "Be brief."), Message("user", "go")]
    model.render_prompt(messages, TOOLS, settings)
    assert rendered == messages
    for step in range(5):
        rendered.clear()
        call = ToolCall("search", {"query": str(step)}, id=f"c{step}")
        added = [
            Message("assistant", "", tool_calls=[call]),
            Message("tool", tool_results=[ToolResult(call.id, "search", step)]),
        ]
        messages += added
        body = json.loads(model.render_prompt(messages, TOOLS, settings))
        assert rendered == added  # the earlier turns came from the cache
        assert len(body["messages"]) == 2 + 2 * (step + 1)
    rendered.clear()
    messages[1].content = "go on"  # changed in place: rendered again, alone
    model.render_prompt(messages, TOOLS, settings)
    assert rendered == [messages[1]]


def test_the_tools_prompt_is_rendered_once_per_tool_set(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = openai_request.hermes_tools_prompt  # type: ignore[attr-defined]

    def counting(tools: Any, **kwargs: Any) -> str:
        calls.append(len(tools))
        return original(tools, **kwargs)

    monkeypatch.setattr(openai_request, "hermes_tools_prompt", counting)
    model = make(mode="hermes")
    messages = [Message("user", "go")]
    for _ in range(3):
        model.render_prompt(messages, TOOLS, ModelSettings())
    assert calls == [2]
    model.render_prompt(messages, [WEATHER], ModelSettings())  # another tool set
    model.render_prompt(messages, TOOLS, ModelSettings(scratch_pad=True))  # another prompt
    assert calls == [2, 1, 2]


def test_values_whose_comparison_fails_are_rendered_again() -> None:
    class NoTruth:
        def __eq__(self, other: object) -> bool:
            raise TypeError("no truth value")

        __hash__ = object.__hash__

        def __str__(self) -> str:
            return "no-truth"

    model = make(mode="native")
    result = ToolResult("c1", "search", {"data": NoTruth()})
    messages = [
        Message("user", "go"),
        Message("assistant", "", tool_calls=[ToolCall("search", {"query": "x"}, id="c1")]),
        Message("tool", tool_results=[result]),
    ]
    model.render_prompt(messages, TOOLS, ModelSettings())
    result.content["data"] = NoTruth()  # another object whose == raises
    body = json.loads(model.render_prompt(messages, TOOLS, ModelSettings()))
    assert body["messages"][-1]["content"] == '{"data": "no-truth"}'


def test_the_cache_lets_go_of_finished_conversations() -> None:
    # Bounded in entries and in characters: two generations at most, the older one let go
    # when the current one fills up, unless its entries are used again meanwhile.
    cache = openai_request._Generations(capacity=4, characters=1_000)
    rendered: list[Message] = []

    def render(message: Message) -> list[dict[str, Any]]:
        rendered.append(message)
        return openai_request.native_messages(message)

    live = Message("user", "still in use")
    old = [Message("user", f"finished {i}") for i in range(3)]
    for message in [live, *old]:
        cache.render(message, render)
    for i in range(8):  # another conversation fills two generations; ``live`` stays in use
        cache.render(Message("user", f"new {i}"), render)
        cache.render(live, render)
    rendered.clear()
    for message in [live, *old]:
        cache.render(message, render)
    assert rendered == old  # the finished ones were let go, the live one was kept

    by_size = openai_request._Generations(capacity=100, characters=1_000)
    big = [Message("user", "x" * 600) for _ in range(5)]
    for message in big:  # two fill a generation: the fifth pushes the first two out
        by_size.render(message, render)
    rendered.clear()
    for message in big:
        by_size.render(message, render)
    assert rendered[:2] == big[:2]
