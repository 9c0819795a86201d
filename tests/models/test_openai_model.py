"""OpenAICompatible against a real local HTTP server (tests/harness/openai_server.py), both
modes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from hermes_agent.errors import ConfigError, ModelError
from hermes_agent.models.base import Model, ModelSettings
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.types import Completion, Message, ModelResponse, StreamChunk, ToolCall, ToolResult
from openai_server import (  # noqa: F401  (the fixtures)
    Reply,
    ScriptedServer,
    call,
    error,
    free_port,
    running_fixture,
    running_server,
    server_fixture,
    text,
    tool_calls,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER]
ASK = [Message("system", "Be brief."), Message("user", "Weather in Paris?")]
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


TRANSPORT = ["httpx"]


@pytest.fixture(autouse=True, params=["httpx", "aiohttp"])
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test here runs with each of the SDK's HTTP clients (``transport``)."""
    TRANSPORT[0] = request.param
    yield request.param
    TRANSPORT[0] = "httpx"


def make(server: ScriptedServer, **kwargs: Any) -> OpenAICompatible:
    kwargs.setdefault("max_retries", 0)
    kwargs.setdefault("transport", TRANSPORT[0])
    return OpenAICompatible("test-model", base_url=server.base_url, **kwargs)


def complete(
    model: OpenAICompatible,
    messages: list[Message] = ASK,
    tools: list[dict[str, Any]] = TOOLS,
    **settings: Any,
) -> ModelResponse:
    async def run() -> ModelResponse:
        try:
            return await model.complete(messages, tools, ModelSettings(**settings))
        finally:
            await model.aclose()

    return asyncio.run(run())


def stream(
    model: OpenAICompatible,
    messages: list[Message] = ASK,
    tools: list[dict[str, Any]] = TOOLS,
    **settings: Any,
) -> list[StreamChunk]:
    async def collect() -> list[StreamChunk]:
        try:
            return [c async for c in model.stream(messages, tools, ModelSettings(**settings))]
        finally:
            await model.aclose()

    return asyncio.run(collect())


def calls_of(completion: Completion) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in completion.tool_calls]


def same(a: Completion, b: Completion) -> bool:
    """Equal up to call ids (the parser makes fresh ones) and surrounding whitespace."""
    return (
        calls_of(a) == calls_of(b)
        and a.content.strip() == b.content.strip()
        and len(a.errors) == len(b.errors)
    )


def conversation_with_results() -> list[Message]:
    first = ToolCall("get_weather", {"city": "Paris"}, id="call_1")
    second = ToolCall("get_weather", {"city": "Tōkyō"}, id="call_2")
    return [
        *ASK,
        Message("assistant", "Checking.", tool_calls=[first, second]),
        Message(
            "tool",
            tool_results=[
                ToolResult("call_1", "get_weather", {"temp_c": 18, "sky": None}),
                ToolResult("call_2", "get_weather", "晴れ"),
            ],
        ),
    ]


# -- construction -----------------------------------------------------------------------------


def test_is_a_model_and_validates_its_arguments(server: ScriptedServer) -> None:
    model = make(server)
    assert isinstance(model, Model)
    assert model.name == "test-model"
    assert model.base_url.startswith(server.base_url)
    with pytest.raises(ConfigError, match="mode"):
        OpenAICompatible("m", mode="chat")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="chat_format"):
        OpenAICompatible("m", chat_format="llama")


def test_a_given_client_is_used_as_is(server: ScriptedServer) -> None:
    client = AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
    model = OpenAICompatible("test-model", base_url="http://unused.invalid/v1", client=client)
    server.push(text("via the given client"))
    assert complete(model).text == "via the given client"
    assert model.base_url.startswith(server.base_url)


# -- hermes mode ------------------------------------------------------------------------------


def test_hermes_request_carries_the_tools_prompt_and_no_tools_field(server: ScriptedServer) -> None:
    server.push(text("It is sunny."))
    response = complete(make(server, temperature=0.2, max_tokens=50))

    body = server.last
    assert "tools" not in body and "tool_choice" not in body
    system = body["messages"][0]
    assert system["role"] == "system"
    assert "<tools>" in system["content"] and '"name": "get_weather"' in system["content"]
    assert "Be brief." in system["content"]
    assert body["messages"][1] == {"role": "user", "content": "Weather in Paris?"}
    assert body["model"] == "test-model"
    assert body["temperature"] == 0.2 and body["max_tokens"] == 50

    assert response.text == "It is sunny."
    assert response.completion.content == "It is sunny."
    assert response.completion.tool_calls == []
    assert response.model_name == "scripted-model"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (11, 7)
    assert response.usage.requests == 1


def test_settings_override_model_defaults(server: ScriptedServer) -> None:
    complete(make(server, temperature=0.2, max_tokens=50), temperature=0.9, max_tokens=5)
    assert server.last["temperature"] == 0.9 and server.last["max_tokens"] == 5
    complete(make(server))
    assert "temperature" not in server.last and "max_tokens" not in server.last


def test_hermes_tool_call_text_is_parsed(server: ScriptedServer) -> None:
    raw = f"Let me look.\n{HERMES_CALL}"
    server.push(text(raw))
    response = complete(make(server))
    assert response.text == raw
    assert calls_of(response.completion) == [("get_weather", {"city": "Paris"})]
    assert response.completion.content.strip() == "Let me look."


def test_hermes_mode_keeps_calls_a_server_parsed_itself(server: ScriptedServer) -> None:
    server.push(tool_calls(call("get_weather", {"city": "Paris"}, "call_srv")))
    response = complete(make(server))
    assert response.completion.tool_calls == [
        ToolCall("get_weather", {"city": "Paris"}, id="call_srv")
    ]
    assert response.text == HERMES_CALL


def test_hermes_tool_choice_shapes_the_prompt(server: ScriptedServer) -> None:
    model = make(server)
    complete(model, tool_choice="none")
    assert "<tools>" not in json.dumps(server.last["messages"])
    complete(model, tool_choice="get_weather")
    assert "You must call the function get_weather" in server.last["messages"][0]["content"]
    complete(model, scratch_pad=True)
    assert "<scratch_pad>" in server.last["messages"][0]["content"]


def test_hermes_tool_results_go_back_as_tool_responses(server: ScriptedServer) -> None:
    complete(make(server), conversation_with_results())
    messages = server.last["messages"]
    assert messages[-2] == {
        "role": "assistant",
        "content": "Checking.\n"
        + HERMES_CALL
        + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tōkyō"}}\n</tool_call>',
    }
    results = messages[-1]
    assert results["role"] == "tool"
    assert results["content"] == (
        '<tool_response>\n{"name": "get_weather", "content": {"temp_c": 18, "sky": null}}\n'
        "</tool_response>\n"
        '<tool_response>\n{"name": "get_weather", "content": "晴れ"}\n</tool_response>'
    )


def test_qwen_format_returns_results_in_a_user_turn(server: ScriptedServer) -> None:
    complete(make(server, chat_format="qwen"), conversation_with_results())
    messages = server.last["messages"]
    assert "# Tools" in messages[0]["content"]
    assert messages[-1]["role"] == "user"
    assert messages[-1]["content"].startswith("<tool_response>")


@pytest.mark.parametrize(
    "content",
    [
        "Plain answer, no tools.",
        f"Let me check.\n{HERMES_CALL}",
        HERMES_CALL + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}',
        "<tool_call>\n{not json}\n</tool_call>",
    ],
)
def test_hermes_stream_parses_like_complete(server: ScriptedServer, content: str) -> None:
    model = make(server)
    server.push(text(content), text(content))
    response = complete(model)
    chunks = stream(model)

    assert server.last["stream"] is True
    assert server.last["stream_options"] == {"include_usage": True}
    joined = "".join(c.text for c in chunks)
    assert joined == response.text == content
    assert same(parse_completion(joined), response.completion)
    assert len(chunks) > 2  # really streamed, not one piece
    assert chunks[-1].text == "" and chunks[-1].usage == response.usage
    assert all(c.usage is None for c in chunks[:-1])


# -- native mode ------------------------------------------------------------------------------


def test_native_request_sends_tools_and_reads_tool_calls(server: ScriptedServer) -> None:
    server.push(tool_calls(call("get_weather", {"city": "Paris"}, "call_abc")))
    response = complete(make(server, mode="native"))

    body = server.last
    assert body["tools"] == TOOLS
    assert body["tool_choice"] == "auto"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    assert response.completion.tool_calls == [
        ToolCall("get_weather", {"city": "Paris"}, id="call_abc")
    ]
    assert response.text == HERMES_CALL
    assert same(parse_completion(response.text), response.completion)
    assert response.usage.total_tokens == 18


def test_native_without_tools_sends_neither_tools_nor_tool_choice(server: ScriptedServer) -> None:
    server.push(text("Hi."))
    response = complete(make(server, mode="native"), tools=[])
    assert "tools" not in server.last and "tool_choice" not in server.last
    assert response.text == "Hi." and response.completion.content == "Hi."


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", "auto"),
        ("required", "required"),
        ("none", "none"),
        ("get_weather", {"type": "function", "function": {"name": "get_weather"}}),
    ],
)
def test_native_tool_choice_mapping(server: ScriptedServer, choice: str, wire: Any) -> None:
    complete(make(server, mode="native"), tool_choice=choice)
    assert server.last["tool_choice"] == wire


def test_native_catches_tool_calls_leaked_into_content(server: ScriptedServer) -> None:
    leaked = f"Sure.\n{HERMES_CALL}"
    server.push(tool_calls(call("get_weather", {"city": "Rome"}, "call_r"), content=leaked))
    response = complete(make(server, mode="native"))

    assert calls_of(response.completion) == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome"}),
    ]
    assert "<tool_call>" not in response.completion.content
    assert response.completion.content.strip() == "Sure."
    assert response.text.startswith(leaked)
    assert same(parse_completion(response.text), response.completion)


def test_native_malformed_arguments_become_parse_errors(server: ScriptedServer) -> None:
    server.push(
        tool_calls(
            call("get_weather", '{"city": "Paris"', "call_bad"),
            call("get_weather", '["Paris"]', "call_list"),
            call("get_weather", {"city": "Lima"}, "call_ok"),
        )
    )
    response = complete(make(server, mode="native"))

    assert calls_of(response.completion) == [("get_weather", {"city": "Lima"})]
    errors = response.completion.errors
    assert len(errors) == 2
    assert "not valid JSON" in errors[0].message and '{"city": "Paris"' in errors[0].block
    assert "JSON object" in errors[1].message
    assert response.text.count("<tool_call>") == 3  # the raw text still shows every call


def test_native_arguments_tolerated_when_empty_or_double_encoded(server: ScriptedServer) -> None:
    server.push(
        tool_calls(
            call("now", "", "call_now"),
            call("get_weather", json.dumps(json.dumps({"city": "Bern"})), "call_2x"),
        )
    )
    response = complete(make(server, mode="native"))
    assert calls_of(response.completion) == [("now", {}), ("get_weather", {"city": "Bern"})]
    assert response.completion.errors == []


def test_native_tool_results_go_back_with_tool_call_ids(server: ScriptedServer) -> None:
    complete(make(server, mode="native"), conversation_with_results())
    messages = server.last["messages"]
    assert messages[2] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Tōkyō"}'},
            },
        ],
    }
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18, "sky": null}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '"晴れ"'},
    ]


@pytest.mark.parametrize(
    "reply",
    [
        text("Just text, streamed in small pieces."),
        tool_calls(call("get_weather", {"city": "Paris"})),
        tool_calls(
            call("get_weather", {"city": "Paris"}, "c1"),
            call("get_weather", {"city": "京都", "note": "a } and </tool_call>"}, "c2"),
            content="Two at once.",
        ),
        tool_calls(call("get_weather", {"city": "Rome"}), content=f"Leaked:\n{HERMES_CALL}"),
        tool_calls(call("now", "")),
        tool_calls(call("get_weather", '{"city": ')),
    ],
    ids=["text", "one-call", "two-calls", "leaked", "no-arguments", "malformed"],
)
def test_native_stream_parses_like_complete(server: ScriptedServer, reply: Any) -> None:
    model = make(server, mode="native")
    server.push(reply, reply)
    response = complete(model)
    chunks = stream(model)

    joined = "".join(c.text for c in chunks)
    streamed = parse_completion(joined)
    assert same(streamed, response.completion), joined
    assert same(parse_completion(response.text), response.completion)
    assert chunks[-1].text == "" and chunks[-1].usage == response.usage


def test_native_stream_opens_a_call_as_soon_as_its_name_arrives(server: ScriptedServer) -> None:
    server.push(tool_calls(call("get_weather", {"city": "Paris"})))
    texts = [c.text for c in stream(make(server, mode="native"))]
    assert (
        texts[0] == '<tool_call>\n{"id": "call_get_weather", "name": "get_weather", "arguments": '
    )
    assert texts[-2] == "}\n</tool_call>"


def test_stream_tolerates_servers_that_ignore_include_usage(server: ScriptedServer) -> None:
    server.push(text("No usage here.", stream_usage=False))
    chunks = stream(make(server))
    assert "".join(c.text for c in chunks) == "No usage here."
    last = chunks[-1]
    assert last.usage is not None and last.usage.requests == 1
    assert last.usage.total_tokens == 0


@pytest.mark.parametrize("mode", ["hermes", "native"])
def test_empty_content_is_a_model_error_not_an_empty_completion(
    server: ScriptedServer, mode: str
) -> None:
    # An empty reply used to come back as an empty completion, which the run reported as a
    # successful empty answer; it is a model error now (issue: honest empty answers).
    server.push(text(""), tool_calls(content=None))
    model = make(server, mode=mode)
    for _ in range(2):
        with pytest.raises(ModelError, match="empty reply"):
            complete(model)


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
def test_server_error_becomes_a_model_error(server: ScriptedServer, streaming: bool) -> None:
    server.push(error(500, "the GPU caught fire"))
    model = make(server)
    with pytest.raises(ModelError) as caught:
        stream(model) if streaming else complete(model)
    message = str(caught.value)
    assert server.base_url in message
    assert "500" in message and "the GPU caught fire" in message
    assert "logs" in message
    assert len(server.requests) == 1  # max_retries=0: the SDK did not retry


def test_sdk_retries_before_giving_up(server: ScriptedServer) -> None:
    server.push(error(503), text("Recovered."))
    model = make(server, max_retries=1)
    assert complete(model).text == "Recovered."
    assert len(server.requests) == 2


def test_not_found_names_model_and_base_url(server: ScriptedServer) -> None:
    server.push(error(404, "model 'test-model' not found"))
    with pytest.raises(ModelError, match="404") as caught:
        complete(make(server))
    assert "model name" in str(caught.value) and "not found" in str(caught.value)


@pytest.mark.parametrize("streaming", [False, True])
def test_connection_refused_becomes_a_model_error(streaming: bool) -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    model = OpenAICompatible(
        "test-model", base_url=base_url, max_retries=0, timeout=5, transport=TRANSPORT[0]
    )
    with pytest.raises(ModelError) as caught:
        stream(model) if streaming else complete(model)
    message = str(caught.value)
    assert f"Is the server running at {base_url}" in message
    assert "Traceback" not in message


def test_timeout_becomes_a_model_error(server: ScriptedServer) -> None:
    server.push(text("too late", delay=1.0))
    with pytest.raises(ModelError, match=r"did not answer within 0\.2 s"):
        complete(make(server, timeout=0.2))


def test_one_model_serves_several_event_loops(server: ScriptedServer) -> None:
    # The sync facade runs each turn in its own asyncio.run: a client (and its pooled
    # connections) must not outlive the loop it was used on, even without aclose().
    model = make(server, mode="native")
    server.push(text("one"), text("two"), text("three"))
    settings = ModelSettings()
    answers = [asyncio.run(model.complete(ASK, TOOLS, settings)).text for _ in range(2)]
    assert answers == ["one", "two"]
    assert "".join(c.text for c in stream(model)) == "three"


# -- real servers' expectations and honest failures ------------------------------------------------


def test_native_assistant_turns_with_calls_send_empty_content_not_null(
    server: ScriptedServer,
) -> None:
    turn = Message("assistant", "", tool_calls=[ToolCall("get_weather", {"city": "Oslo"}, "c1")])
    complete(make(server, mode="native"), [*ASK, turn])
    assistant = [m for m in server.last["messages"] if m["role"] == "assistant"]
    assert assistant[0]["content"] == "" and assistant[0]["tool_calls"][0]["id"] == "c1"


def test_hermes_tool_turns_carry_the_id_of_the_call_they_answer(server: ScriptedServer) -> None:
    complete(make(server), conversation_with_results())
    tool_turns = [m for m in server.last["messages"] if m["role"] == "tool"]
    assert tool_turns and tool_turns[0]["tool_call_id"] == "call_1"
    assert "<tool_response>" in tool_turns[0]["content"]


def test_an_empty_reply_is_retried_then_a_model_error(server: ScriptedServer) -> None:
    server.push(text(""), text("Sunny."))
    response = complete(make(server, max_retries=1))
    assert response.text == "Sunny." and len(server.requests) == 2
    assert response.usage.requests == 2

    server.reset()
    server.push(text(""), text("   "))
    expected = r"returned an empty reply .*finish_reason=stop, 2 attempts"
    with pytest.raises(ModelError, match=expected):
        complete(make(server, max_retries=1))


def test_an_empty_reply_fails_the_run_with_502(server: ScriptedServer) -> None:
    from hermes_agent import Agent

    server.push(text(""))
    result = Agent(model=make(server)).run("hi")
    assert result.status == 502 and "empty reply" in (result.error or "")
    assert result.output != ""


def test_a_stream_that_ends_empty_is_asked_again_without_streaming(
    server: ScriptedServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.push(Reply(abort=True), text("Sunny in Paris."))
    with caplog.at_level("WARNING", logger="hermes_agent"):
        chunks = stream(make(server, mode="native"))
    assert "".join(c.text for c in chunks) == "Sunny in Paris."
    assert [bool(r.get("stream")) for r in server.requests] == [True, False]
    assert "ended the stream without a reply (it may not stream tool calls)" in caplog.text
    assert chunks[-1].usage is not None and chunks[-1].usage.requests == 2


def test_a_stream_that_ends_empty_twice_is_a_model_error(server: ScriptedServer) -> None:
    server.push(Reply(abort=True), text(""))
    with pytest.raises(ModelError, match="empty reply"):
        stream(make(server))


def test_a_long_server_message_keeps_its_end(server: ScriptedServer) -> None:
    cause = "the real cause: messages.3.content must not be null"
    server.push(error(400, "validation failed:\n" + "detail line\n" * 200 + cause))
    with pytest.raises(ModelError) as caught:
        complete(make(server))
    message = str(caught.value)
    assert "answered HTTP 400: validation failed:" in message and cause in message
    assert len(message) < 1000


def test_hermes_mode_with_grammar_sends_a_gbnf_grammar(server: ScriptedServer) -> None:
    model = make(server, grammar=True)
    assert model.profile.tool_choice_enforcement == "grammar"
    complete(model, tool_choice="get_weather")
    grammar = server.last["grammar"]
    assert "<tool_call>" in grammar and "get_weather" in grammar and "root ::=" in grammar
    complete(model, tools=[])
    assert "grammar" not in server.last
    native = make(server, mode="native", grammar=True)
    complete(native)
    assert "grammar" not in server.last and native.profile.tool_choice_enforcement == "server"
    assert make(server).profile.tool_choice_enforcement == "prompt"


def test_a_stream_of_only_whitespace_counts_as_empty(server: ScriptedServer) -> None:
    server.push(text("\n  "), text("Sunny."))
    chunks = stream(make(server))
    assert "".join(c.text for c in chunks).strip() == "Sunny."
    assert [bool(r.get("stream")) for r in server.requests] == [True, False]


def test_the_grammar_constrains_only_a_turn_that_must_call(server: ScriptedServer) -> None:
    model = make(server, grammar=True)
    complete(model, tool_choice="auto")
    assert "grammar" not in server.last
    complete(model, tool_choice="required")
    assert "grammar" in server.last
