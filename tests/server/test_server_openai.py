"""The OpenAI-compatible facade over a real uvicorn on loopback, with the official ``openai``
SDK as the client (sync and async, stream and not), on SQLite and PostgreSQL: answers, server-side
tools, sessions through ``user`` and the header, history from a standalone request, keys and
isolation, approvals, limits, failures, strict input checks in OpenAI's error shape, and the
service docs' example."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hermes_agent import Agent, ScriptedModel
from hermes_agent.errors import ModelError
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.server.openai.answer import AnswerText
from hermes_agent.server.openai.wire import ContentPart, OpenAIError, content_text
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message
from server_harness import call, delete_file, local, poll_run, serve, wait, wait_for
from storage_backends import sql_database_url  # noqa: F401  (the sql_url fixture)
from storage_backends import sqlite_url as sqlite

MODEL = "hermes-agent"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "openai-facade.md"


def script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """``slow S`` → a tool that waits S seconds, then ``done: ...``; ``delete X`` → a call
    that needs approval; ``... recall`` → the earlier user messages the prompt holds; ``pirate?``
    → whether any message of the prompt holds the word PIRATE; ``explode`` → the model
    fails; anything else → ``Hello!``."""
    last = max(i for i, m in enumerate(messages) if m.role == "user")
    user = str(messages[last].content)
    done = sum(1 for m in messages[last:] if m.role == "tool")
    words = user.split()
    if done:
        return outcome(messages[-1])
    if words[0] == "slow":
        return call("wait", seconds=float(words[1]))
    if words[0] == "delete":
        return call("delete_file", path=words[1])
    if words[-1] == "recall":
        earlier = [str(m.content) for m in messages[:last] if m.role == "user"]
        return "You said: " + " | ".join(earlier) if earlier else "You said nothing before."
    if user == "pirate?":
        return "pirate" if any("PIRATE" in str(m.content) for m in messages) else "plain"
    if user == "explode":
        raise ModelError("the model endpoint is down")
    return "Hello!"


def outcome(message: Message) -> str:
    """``done: <data>`` for a tool's result, ``refused: <error>`` for an error."""
    content = message.tool_results[0].content
    if content.get("error"):
        return f"refused: {content['error']}"
    return f"done: {content['data']}"


def make_agent(storage: str) -> Agent:
    agent = Agent(model=ScriptedModel(script, chunk_size=3), storage=storage)
    agent.add_tool(Tool.from_function(wait))
    agent.add_tool(Tool.from_function(delete_file, requires_approval=True))
    return agent


def sdk(url: str, key: str = "unused", **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, **options)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def streamed(chunks: Any) -> tuple[str, list[Any]]:
    """The content a stream carries, and its chunks."""
    seen = list(chunks)
    text = "".join(c.choices[0].delta.content or "" for c in seen if c.choices)
    return text, seen


# -- answers, stream and not ------------------------------------------------------------------


def test_the_sdk_gets_answers_with_tools_run_server_side(sql_url: str) -> None:
    with serve(create_app(agent=make_agent(sql_url), settings=local())) as url:
        client = sdk(url)
        assert [m.id for m in client.models.list()] == [MODEL]
        assert client.models.retrieve(MODEL).owned_by == "hermes-agent"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("gpt-4o")

        reply = client.chat.completions.create(model=MODEL, messages=[user("slow 0.2")])
        assert reply.object == "chat.completion" and reply.model == MODEL
        choice = reply.choices[0]
        assert choice.message.role == "assistant"
        assert choice.message.content == "done: waited"
        assert choice.finish_reason == "stop"
        assert choice.message.tool_calls is None  # the client has nothing to run
        assert reply.usage is not None and reply.usage.total_tokens > 0
        assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
        hermes = reply.hermes  # type: ignore[attr-defined]
        assert reply.id == f"chatcmpl-{hermes['request_id']}"
        assert hermes["status"] == "completed"
        ran = hermes["tool_calls"]
        assert [(c["name"], c["arguments"], c["result"]) for c in ran] == [
            ("wait", {"seconds": 0.2}, "waited")
        ]
        # The run is an ordinary run of the service: its status and trace are there.
        http = httpx.Client(base_url=url, timeout=30)
        status = http.get(f"/v1/runs/{hermes['request_id']}").json()
        assert status["status"] == "completed"
        assert status["result"]["output"] == "done: waited"
        assert http.get(f"/v1/runs/{hermes['request_id']}/trace").json()["records"]

        # The same question streamed: chunks reassemble to the same answer.
        text, chunks = streamed(
            client.chat.completions.create(
                model=MODEL,
                messages=[user("slow 0.2")],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert text == choice.message.content
        assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
        assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        finish = chunks[-2]
        assert finish.choices[0].finish_reason == "stop"
        assert [c["name"] for c in finish.hermes["tool_calls"]] == ["wait"]  # type: ignore[attr-defined]
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.total_tokens == reply.usage.total_tokens
        assert all(c.usage is None for c in chunks[:-1])
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 3


def test_the_async_sdk_streams_and_answers(tmp_path: Path) -> None:
    async def talk(url: str) -> tuple[str, str, list[str]]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused")
        reply = await client.chat.completions.create(model=MODEL, messages=[user("hello")])
        stream = await client.chat.completions.create(
            model=MODEL, messages=[user("hello")], stream=True
        )
        pieces = [c.choices[0].delta.content or "" async for c in stream]
        await client.close()
        return str(reply.choices[0].message.content), "".join(pieces), pieces

    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=local())) as url:
        answer, text, pieces = asyncio.run(talk(url))
    assert answer == text == "Hello!"
    assert len([p for p in pieces if p]) >= 2  # streamed, not one lump


def test_the_raw_stream_is_openai_sse_ending_with_done(tmp_path: Path) -> None:
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=local())) as url:
        body = {"model": MODEL, "messages": [user("hello")], "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["x-accel-buffering"] == "no"
            session = r.headers["x-hermes-session-id"]
            lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)  # no event names: OpenAI's framing
    assert lines[-1] == "data: [DONE]"
    assert session


# -- sessions -----------------------------------------------------------------------------------


def test_user_maps_to_a_session_that_the_service_keeps(sql_url: str) -> None:
    # The operator's opt-in: ``user`` names a session (by default it names an end user only).
    settings = local(openai_user_sessions=True)
    with serve(create_app(agent=make_agent(sql_url), settings=settings)) as url:
        client = sdk(url)
        first = client.chat.completions.create(
            model=MODEL, messages=[user("my name is Ada")], user="conv-1"
        )
        assert first.hermes["session_id"] == "conv-1"  # type: ignore[attr-defined]
        # The client resends the transcript, as OpenAI clients do: the stored history counts,
        # the resent one is ignored (nothing twice).
        transcript = [
            user("my name is Ada"),
            {"role": "assistant", "content": str(first.choices[0].message.content)},
            user("recall"),
        ]
        second = client.chat.completions.create(model=MODEL, messages=transcript, user="conv-1")
        assert second.choices[0].message.content == "You said: my name is Ada"
        # The header names the session too, and wins over ``user``.
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[user("recall")],
            user="conv-2",
            extra_headers={"X-Hermes-Session-Id": "conv-1"},
        )
        assert raw.headers["x-hermes-session-id"] == "conv-1"
        assert raw.parse().choices[0].message.content == ("You said: my name is Ada | recall")
        stored = httpx.get(f"{url}/v1/sessions/conv-1", timeout=30).json()["messages"]
        assert [m["role"] for m in stored] == ["user", "assistant"] * 3
        # A stream continues the same session.
        text, _ = streamed(
            client.chat.completions.create(
                model=MODEL, messages=[user("recall")], user="conv-1", stream=True
            )
        )
        assert text == "You said: my name is Ada | recall | recall"


def test_without_a_session_the_request_is_the_whole_conversation(tmp_path: Path) -> None:
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=local())) as url:
        client = sdk(url)
        messages = [
            {"role": "system", "content": "You are a PIRATE."},
            user("my name is Ada"),
            {"role": "assistant", "content": "Hello Ada"},
            user("I like tea"),
            user("recall"),
        ]
        reply = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        answer = reply.parse()
        # Earlier user and assistant turns are the history; trailing user messages are joined.
        assert answer.choices[0].message.content == "You said: my name is Ada"
        session = answer.hermes["session_id"]  # type: ignore[attr-defined]
        assert reply.headers["x-hermes-session-id"] == session
        stored = httpx.get(f"{url}/v1/sessions/{session}", timeout=30).json()["messages"]
        assert [(m["role"], m["content"]) for m in stored] == [
            ("user", "my name is Ada"),
            ("assistant", "Hello Ada"),
            ("user", "I like tea\n\nrecall"),
            ("assistant", "You said: my name is Ada"),
        ]
        # A system message is not given to the model: the agent's instructions are its own.
        pirate = client.chat.completions.create(
            model=MODEL, messages=[messages[0], user("pirate?")]
        )
        assert pirate.choices[0].message.content == "plain"
        # The session a standalone request started can be carried on with the header.
        carried = client.chat.completions.create(
            model=MODEL,
            messages=[user("recall")],
            extra_headers={"X-Hermes-Session-Id": session},
        )
        assert carried.choices[0].message.content == (
            "You said: my name is Ada | I like tea\n\nrecall"
        )
        # Two standalone requests never share a session.
        alone = client.chat.completions.create(model=MODEL, messages=[user("recall")])
        assert alone.choices[0].message.content == "You said nothing before."


# -- keys, isolation, limits --------------------------------------------------------------------


def test_keys_and_isolation_between_users(tmp_path: Path) -> None:
    keys = MemoryKeyStore()
    alice_key, bob_key = keys.create("alice"), keys.create("bob")
    settings = ServiceSettings(auth="keys", openai_user_sessions=True)
    app = create_app(agent=make_agent(sqlite(tmp_path)), settings=settings, keys=keys)
    with serve(app) as url:
        for key in ("hk_0123456789abcdef.not-the-right-secret-at-all", "nonsense"):
            with pytest.raises(openai.AuthenticationError) as caught:
                sdk(url, key).chat.completions.create(model=MODEL, messages=[user("hello")])
            assert caught.value.status_code == 401
            assert caught.value.code == "invalid_api_key"
            assert caught.value.type == "authentication_error"
            assert "API key" in caught.value.message
        with pytest.raises(openai.AuthenticationError):
            sdk(url, "nonsense").models.list()
        alice, bob = sdk(url, alice_key), sdk(url, bob_key)
        alice.chat.completions.create(model=MODEL, messages=[user("alice secret")], user="s")
        # Bob's session "s" is his own: he sees nothing of Alice's.
        answer = bob.chat.completions.create(model=MODEL, messages=[user("recall")], user="s")
        assert answer.choices[0].message.content == "You said nothing before."
        again = alice.chat.completions.create(model=MODEL, messages=[user("recall")], user="s")
        assert again.choices[0].message.content == "You said: alice secret"
        # Nor can Bob read Alice's run.
        request_id = again.hermes["request_id"]  # type: ignore[attr-defined]
        headers = {"Authorization": f"Bearer {bob_key}"}
        assert httpx.get(f"{url}/v1/runs/{request_id}", headers=headers).status_code == 404


def test_limits_apply_as_for_any_run(tmp_path: Path) -> None:
    settings = local(max_runs_in_flight_per_user=1, max_message_chars=50)
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=settings)) as url:
        client = sdk(url, max_retries=0)
        busy = threading.Thread(
            target=client.chat.completions.create,
            kwargs={"model": MODEL, "messages": [user("slow 1.5")]},
        )
        busy.start()
        http = httpx.Client(base_url=url, timeout=30)
        wait_for(lambda: any(r["status"] == "running" for r in http.get("/v1/runs").json()["runs"]))
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model=MODEL, messages=[user("hello")])
        assert caught.value.response.headers["retry-after"] == "1"
        assert caught.value.code == "rate_limit_exceeded"
        busy.join(30)
        with pytest.raises(openai.APIStatusError) as too_long:
            client.chat.completions.create(model=MODEL, messages=[user("x" * 51)])
        assert too_long.value.status_code == 413
        assert "max_message_chars" in too_long.value.message


# -- approvals ----------------------------------------------------------------------------------


def test_a_tool_that_needs_approval(tmp_path: Path) -> None:
    settings = local(keepalive_s=0.1)
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=settings)) as url:
        client = sdk(url)
        http = httpx.Client(base_url=url, timeout=30)
        # Plain: the answer says what waits and how to answer it; the run goes on after.
        reply = client.chat.completions.create(model=MODEL, messages=[user("delete a.txt")])
        hermes = reply.hermes  # type: ignore[attr-defined]
        assert hermes["status"] == "waiting_approval"
        (pending,) = hermes["pending_approvals"]
        assert (pending["tool"], pending["arguments"]) == ("delete_file", {"path": "a.txt"})
        content = str(reply.choices[0].message.content)
        assert f"POST /v1/approvals/{pending['approval_id']}" in content
        assert "'delete_file'" in content and "a.txt" in content
        answered = http.post(f"/v1/approvals/{pending['approval_id']}", json={"approved": True})
        assert answered.status_code == 200
        done = poll_run(http, hermes["request_id"])
        assert done["result"]["output"] == "done: deleted a.txt"

        # Streamed: the note comes as content, the stream stays open, the answer follows.
        stream = client.chat.completions.create(
            model=MODEL, messages=[user("delete b.txt")], stream=True
        )
        text = ""
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            waiting = (chunk.model_extra or {}).get("hermes", {}).get("approval_required")
            if waiting:
                assert waiting["arguments"] == {"path": "b.txt"}
                time.sleep(0.5)  # keep-alive comments meanwhile: the SDK skips them
                http.post(f"/v1/approvals/{waiting['approval_id']}", json={"approved": False})
        note, _, answer = text.partition("\n\n")
        assert "needs your approval" in note and "b.txt" in note
        assert answer.startswith("refused: ") and "denied" in answer


# -- failures and bad input ---------------------------------------------------------------------


def test_a_failed_run_is_an_error_the_sdk_does_not_retry(tmp_path: Path) -> None:
    agent = make_agent(sqlite(tmp_path))
    with serve(create_app(agent=agent, settings=local())) as url:
        client = sdk(url)  # the SDK retries 5xx by default: this one must not
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model=MODEL, messages=[user("explode")])
        assert caught.value.status_code == 502
        assert caught.value.response.headers["x-should-retry"] == "false"
        assert "the model endpoint is down" in caught.value.message
        assert caught.value.code == "run_failed"
        model = agent.model
        assert isinstance(model, ScriptedModel)
        assert len(model.requests) == 1
        # Streamed, the error arrives as an error frame, which the SDK raises.
        with pytest.raises(openai.APIError, match="the model endpoint is down"):
            streamed(
                client.chat.completions.create(model=MODEL, messages=[user("explode")], stream=True)
            )


def test_a_streamed_run_can_be_cancelled_by_its_id(tmp_path: Path) -> None:
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=local())) as url:
        stream = sdk(url).chat.completions.create(
            model=MODEL, messages=[user("slow 30")], stream=True
        )
        first = next(iter(stream))
        request_id = first.id.removeprefix("chatcmpl-")
        assert request_id == first.hermes["request_id"]  # type: ignore[attr-defined]
        cancelled = httpx.post(f"{url}/v1/runs/{request_id}/cancel", timeout=30).json()
        assert cancelled["status"] == "cancelled"
        with pytest.raises(openai.APIError, match="cancelled"):
            list(stream)


@pytest.mark.parametrize(
    ("options", "status", "param", "code"),
    [
        ({"messages": [user("hi"), {"role": "assistant", "content": "x"}]}, 400, "messages", None),
        (
            {"messages": [{"role": "system", "content": "only a system message"}]},
            400,
            "messages",
            None,
        ),
        ({"messages": [user("   ")]}, 400, "messages", None),
        ({"messages": []}, 400, "messages", None),
        ({"n": 2}, 400, "n", "unsupported_parameter"),
        ({"model": "gpt-4o"}, 404, "model", "model_not_found"),
        (  # what a schema says is the gate's to judge, as through every door
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            422,
            None,
            None,
        ),
        ({"tools": [{"type": "web_search"}]}, 400, "tools[0].type", None),
        (
            {"messages": [user("hi"), {"role": "tool", "content": "1", "tool_call_id": "c"}]},
            400,
            "messages[1]",
            "invalid_value",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            400,
            "messages[0].content[0]",
            "unsupported_content",
        ),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", None),
        ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role", None),
        ({"temperature": 7}, 400, "temperature", "invalid_value"),
        ({"logprobs": True}, 400, "logprobs", "unsupported_parameter"),
        ({"response_format": {"type": "xml"}}, 400, "response_format", "invalid_value"),
        ({"response_format": {"type": "json_schema"}}, 400, "response_format", None),
        ({"stream_options": {"include_usage": True}}, 400, "stream_options", None),
        ({"tool_choice": "sometimes"}, 400, "tool_choice", "invalid_value"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, 422, None, None),
        ({"user": ""}, 400, "user", None),
        ({"user": "x" * 300}, 400, "user", "invalid_session_id"),
        ({"extra_body": {"best_of": 3}}, 400, "best_of", "unknown_parameter"),
    ],
)
def test_bad_input_gets_a_clear_error_in_openai_shape(
    tmp_path: Path, options: dict[str, Any], status: int, param: str | None, code: str | None
) -> None:
    # With ``user`` as a session (the operator's opt-in), its id is checked like the header's.
    app = create_app(agent=make_agent("memory://"), settings=local(openai_user_sessions=True))
    with serve(app) as url:
        request: dict[str, Any] = {"model": MODEL, "messages": [user("hello")], **options}
        with pytest.raises(openai.APIStatusError) as caught:
            sdk(url, max_retries=0).chat.completions.create(**request)
    error = caught.value
    assert error.status_code == status
    body = error.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}
    assert body["type"] == "invalid_request_error"
    assert body["param"] == param
    if code is not None:
        assert body["code"] == code
    assert len(body["message"]) > 15


def test_sampling_settings_are_accepted_and_the_agent_answers(tmp_path: Path) -> None:
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=local())) as url:
        reply = sdk(url).chat.completions.create(
            model=MODEL,
            messages=[user("hello")],
            temperature=0.2,
            max_tokens=5,
            top_p=0.9,
            stop=["\n"],
            seed=1,
            n=1,
            tool_choice="auto",
            parallel_tool_calls=False,
            response_format={"type": "text"},
            metadata={"ticket": "42"},
        )
        assert reply.choices[0].message.content == "Hello!"
        # tool_choice names one of the agent's own tools.
        forced = sdk(url).chat.completions.create(
            model=MODEL,
            messages=[user("slow 0.1")],
            tool_choice={"type": "function", "function": {"name": "wait"}},
        )
        assert forced.choices[0].message.content == "done: waited"


# -- the streamed answer's text -------------------------------------------------------------


def test_answer_text_streams_the_answer_and_keeps_tool_turns_out() -> None:
    answer = AnswerText()
    sent = [answer.delta(t) for t in ("\n", "  ")]  # a tool turn's whitespace: held back
    answer.tool_call()
    sent.append(answer.delta("after the call"))
    answer.end_turn()
    sent += [answer.delta(t) for t in ("\nThe ", "answer ", "is 4\n")]
    answer.end_turn()
    sent.append(answer.finish("The answer is 4"))
    assert sent == ["", "", "", "The", " answer", " is 4", ""]
    # A turn that said something before its call: shown, then the answer after a blank line.
    talk = AnswerText()
    parts = [talk.delta("Let me look."), talk.delta(" ")]
    talk.tool_call()
    talk.end_turn()
    parts += [talk.delta("Found it."), talk.finish("Found it.")]
    assert "".join(parts) == "Let me look.\n\nFound it."
    # What a stream lacks of the final answer is sent at the end.
    quiet = AnswerText()
    assert quiet.finish("I stopped after 8 steps.") == "I stopped after 8 steps."
    partial = AnswerText()
    assert partial.delta("Hel") + partial.finish("Hello!") == "Hello!"


def test_both_apis_read_message_content_the_same_way() -> None:
    # Chat sends parts as validated models, Responses as plain items: one reader for both.
    chat = [
        ContentPart(type="text", text="Hello, "),
        ContentPart.model_validate({"type": "refusal", "refusal": "no"}),
    ]
    responses = [{"type": "input_text", "text": "Hello, "}, {"type": "output_text", "text": "you"}]
    assert content_text(chat, "messages[0].content") == "Hello, "
    assert content_text(responses, "input[0].content") == "Hello, you"
    assert content_text(None, "x") == "" and content_text("plain", "x") == "plain"
    for parts in ([ContentPart(type="image_url")], [{"type": "input_image"}]):
        with pytest.raises(OpenAIError) as refused:
            content_text(parts, "m.content")
        assert refused.value.param == "m.content[0]" and refused.value.code == "unsupported_content"


# -- the docs ------------------------------------------------------------------------------------


def _docs_script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    last = messages[-1]
    if last.role == "tool":
        question = next(str(m.content) for m in reversed(messages) if m.role == "user")
        return f"{question.rstrip('?')} = {last.tool_results[0].content['data']}"
    if "17 * 23" in str(last.content):
        return call("multiply", a=17, b=23)
    return call("multiply", a=391, b=2)


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def test_the_service_docs_openai_example_runs(tmp_path: Path) -> None:
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## Chat completions", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks
    keys = MemoryKeyStore()
    agent = Agent(model=ScriptedModel(_docs_script), storage=sqlite(tmp_path))
    agent.add_tool(Tool.from_function(multiply))
    app = create_app(agent=agent, settings=ServiceSettings(auth="keys"), keys=keys)
    with serve(app) as url:
        namespace: dict[str, Any] = {"key": keys.create("alice")}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            for number, block in enumerate(blocks, start=1):
                code = block.replace("http://127.0.0.1:8000", url)
                exec(compile(code, f"openai-facade.md (openai block {number})", "exec"), namespace)
    printed = out.getvalue().splitlines()
    assert printed[:2] == ["What is 17 * 23 = 391", "['multiply']"]
    assert printed[2] == "And times 2 = 782"


@pytest.mark.embedded
def test_the_facade_with_the_embedded_model() -> None:
    pytest.importorskip("llama_cpp")
    with serve(create_app(settings=local())) as url:
        client = sdk(url, timeout=300)
        reply = client.chat.completions.create(
            model=MODEL, messages=[user("Say hello in one short sentence.")]
        )
        content = str(reply.choices[0].message.content)
        assert content.strip()
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        text, chunks = streamed(
            client.chat.completions.create(
                model=MODEL, messages=[user("Say hello in one short sentence.")], stream=True
            )
        )
        assert text.strip()
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
