"""The OpenAI-compatible model reads the server's reply as plain JSON (``models.openai_reply``):
whatever the server sends — a web page, a list, fields of the wrong type — the model either
reads what has the expected type or fails with a ``ModelError`` that says what came; it never
crashes on an attribute, and never drops a call's arguments."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from hermes_agent.errors import ModelError
from hermes_agent.models import openai_reply as json_reply
from hermes_agent.models.base import ModelSettings
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.types import Message, ModelResponse, StreamChunk
from openai_server import Reply, ScriptedServer, running_fixture, running_server, server_fixture  # noqa: F401  (the fixtures)

ASK = [Message("user", "Weather in Paris?")]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def make(server: ScriptedServer) -> OpenAICompatible:
    return OpenAICompatible("test-model", base_url=server.base_url, max_retries=0)


def complete(model: OpenAICompatible) -> ModelResponse:
    async def run() -> ModelResponse:
        try:
            return await model.complete(ASK, TOOLS, ModelSettings())
        finally:
            await model.aclose()

    return asyncio.run(run())


def stream(model: OpenAICompatible) -> list[StreamChunk]:
    async def run() -> list[StreamChunk]:
        try:
            return [c async for c in model.stream(ASK, TOOLS, ModelSettings())]
        finally:
            await model.aclose()

    return asyncio.run(run())


def completion(message: Any, **extra: Any) -> str:
    return json.dumps({"choices": [{"index": 0, "message": message}], **extra})


def chunk(delta: Any, **extra: Any) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta}], **extra})


# -- whole replies ---------------------------------------------------------------------------


def test_a_web_page_instead_of_a_reply_is_a_model_error_that_says_so(
    server: ScriptedServer,
) -> None:
    server.push(Reply(raw="<html><body>502 Bad Gateway</body></html>", raw_type="text/html"))
    with pytest.raises(ModelError) as caught:
        complete(make(server))
    message = str(caught.value)
    assert "text, not a JSON object" in message
    assert "502 Bad Gateway" in message
    assert "base_url" in message


def test_a_json_list_instead_of_a_reply_is_a_model_error(server: ScriptedServer) -> None:
    server.push(Reply(raw="[1, 2, 3]"))
    with pytest.raises(ModelError, match="JSON that is not an object: a list"):
        complete(make(server))


def test_arguments_sent_as_an_object_are_read_not_dropped(server: ScriptedServer) -> None:
    function = {"name": "get_weather", "arguments": {"city": "Paris"}}
    call = {"id": "c1", "type": "function", "function": function}
    server.push(Reply(raw=completion({"role": "assistant", "content": None, "tool_calls": [call]})))
    response = complete(make(server))
    [parsed] = response.completion.tool_calls
    assert (parsed.name, parsed.arguments, parsed.id) == ("get_weather", {"city": "Paris"}, "c1")


def test_arguments_of_another_type_are_a_parse_error_the_model_is_told(
    server: ScriptedServer,
) -> None:
    call = {"id": "c1", "function": {"name": "get_weather", "arguments": [1, 2]}}
    server.push(Reply(raw=completion({"content": "", "tool_calls": [call]})))
    response = complete(make(server))
    assert response.completion.tool_calls == []
    [problem] = response.completion.errors
    assert "must be a JSON object, not list" in problem.message


def test_fields_of_the_wrong_type_read_as_absent(server: ScriptedServer) -> None:
    function = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    calls = ["not a call", {"id": 7, "function": function}]
    usage = {"prompt_tokens": "many", "completion_tokens": -3}
    raw = completion({"content": 42, "tool_calls": calls}, usage=usage, model=["x"])
    server.push(Reply(raw=raw))
    response = complete(make(server))
    [parsed] = response.completion.tool_calls  # the string entry is skipped
    assert parsed.arguments == {"city": "Oslo"}
    assert parsed.id  # a number is no id: one is made
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (0, 0)
    assert response.model_name == "test-model"


def test_a_reply_with_no_usable_choice_is_an_empty_reply_error(server: ScriptedServer) -> None:
    server.push(Reply(raw=json.dumps({"choices": "none", "usage": None})))
    with pytest.raises(ModelError, match=r"empty reply .*finish_reason=no choices"):
        complete(make(server))


def test_a_json_reply_sent_as_plain_text_is_read(server: ScriptedServer) -> None:
    """Some servers send their JSON as text/plain (or with no type): it is still a reply."""
    server.push(Reply(raw=completion({"content": "Hello"}), raw_type="text/plain"))
    assert complete(make(server)).text == "Hello"


def test_content_sent_as_a_list_of_parts_is_read(server: ScriptedServer) -> None:
    parts = [{"type": "text", "text": "Hel"}, {"type": "image_url"}, {"type": "text", "text": "lo"}]
    server.push(Reply(raw=completion({"content": parts})))
    assert complete(make(server)).text == "Hello"


# -- streams ---------------------------------------------------------------------------------


def test_a_stream_of_json_chunks_is_read_with_calls_and_usage(server: ScriptedServer) -> None:
    head = {"index": 0, "id": "c9", "function": {"name": "get_weather", "arguments": ""}}
    more = {"index": 0, "function": {"arguments": '{"city": "Lima"}'}}
    server.push(
        Reply(
            raw_chunks=[
                chunk({"role": "assistant", "content": "Looking. "}),
                chunk({"tool_calls": [head]}),
                chunk({"tool_calls": [more, "junk"]}),
                json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}),
            ]
        )
    )
    chunks = stream(make(server))
    text = "".join(c.text for c in chunks)
    assert text.startswith("Looking. ")
    assert '"id": "c9"' in text and '{"city": "Lima"}' in text
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (5, 2)


def test_streamed_calls_with_string_indices_and_object_arguments_stay_apart(
    server: ScriptedServer,
) -> None:
    first = {"index": "0", "id": "a", "function": {"name": "get_weather", "arguments": {}}}
    first_more = {"index": "0", "function": {"arguments": '{"city": "Rome"}'}}
    second = {"index": "1", "id": "b", "function": {"name": "get_weather", "arguments": '{"ci'}}
    second_more = {"index": "1", "function": {"arguments": 'ty": "Oslo"}'}}
    server.push(
        Reply(
            raw_chunks=[
                chunk({"tool_calls": [c]}) for c in (first, first_more, second, second_more)
            ]
        )
    )
    text = "".join(c.text for c in stream(make(server)))
    parsed = parse_completion(text)
    assert [(c.id, c.arguments) for c in parsed.tool_calls] == [
        ("a", {"city": "Rome"}),
        ("b", {"city": "Oslo"}),
    ]
    assert parsed.errors == []


def test_a_streamed_call_whose_name_is_not_a_string_is_not_lost(server: ScriptedServer) -> None:
    odd = {"index": 0, "id": "c", "function": {"name": 42, "arguments": '{"city": "Rome"}'}}
    server.push(Reply(raw_chunks=[chunk({"tool_calls": [odd]})]))
    parsed = parse_completion("".join(c.text for c in stream(make(server))))
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("42", {"city": "Rome"})]


def test_a_stream_chunk_that_is_not_an_object_is_a_model_error(server: ScriptedServer) -> None:
    server.push(Reply(raw_chunks=[chunk({"content": "Hi"}), '"just a string"']))
    with pytest.raises(ModelError, match="text, not a JSON object: 'just a string'"):
        stream(make(server))


# -- the readers, directly -------------------------------------------------------------------


def test_readers_take_any_json_value() -> None:
    assert json_reply.first_choice({"choices": [None]}) is None
    assert json_reply.part(None, "message") is None
    assert json_reply.text({"content": ["a"]}, "content") == ""
    assert json_reply.tool_calls({"tool_calls": {"a": 1}}) == []
    assert json_reply.reasoning({"reasoning_content": "", "reasoning": "hmm"}) == "hmm"
    assert json_reply.count({"prompt_tokens": True}, "prompt_tokens") == 0
    assert json_reply.count("usage", "prompt_tokens") == 0
    assert json_reply.call_index({"index": False}) is None
    assert json_reply.call_index({"index": "2"}) == "2"
    assert json_reply.arguments_text({"arguments": {}}) == ""
    assert json_reply.name({"name": ["x"]}) == '["x"]'
    assert json_reply.as_object('{"a": 1}') == {"a": 1}
    assert json_reply.as_object("<html>") is None
    assert json_reply.arguments_text({"arguments": None}) == ""
    assert json_reply.arguments_text({"arguments": {"é": 1}}) == '{"é": 1}'
    assert json_reply.describe(3) == "JSON that is not an object: a int"
    assert json_reply.describe("a\n  b") == "text, not a JSON object: 'a b'"
