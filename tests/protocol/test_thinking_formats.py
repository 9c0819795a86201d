"""Thinking models and the call formats real models emit (issue 27), end to end.

- ``<think>`` is kept apart, and a call written inside a thought never reaches the
  ToolSelector: Hermes text and native mode, streamed and not, closed, unclosed and
  pre-opened (a bare ``</think>``) thoughts.
- Qwen3-Coder XML calls are typed by the tool's schema in the ToolSelector; a value that
  does not fit is a 400 the model reads.
- ``<tools>`` is an alias of ``<tool_call>``; a definition echoed in it is an error.
- A server's ``reasoning_content`` / ``reasoning`` is the step's thought (native mode).
- Property tests: any chunking of any of these forms streams to the one-shot result, and
  the stream parser's work stays linear with thoughts in the text.
"""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI

from hermes_agent import Agent, ScriptedModel
from hermes_agent.events import (
    SelectionEvent,
    TextDeltaEvent,
    ThoughtDeltaEvent,
    ThoughtEvent,
    ToolCallParsedEvent,
)
from hermes_agent.models.base import ModelSettings
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.pipeline.tool_selector import typed_arguments
from hermes_agent.protocol.parser import (
    NOTE_CALL_IN_THOUGHT,
    NOTE_REVEALED_THOUGHT,
    StreamParser,
    ThoughtDelta,
    ThoughtRevealed,
    ToolCallFinished,
    parse_completion,
)
from hermes_agent.types import Completion, RunResult

try:
    from test_parser import counter_ids
    from test_stream_parser import assert_any_chunking_agrees, split, stream
except ImportError:  # pragma: no cover - tests/ is a package
    from tests.test_parser import counter_ids
    from tests.test_stream_parser import assert_any_chunking_agrees, split, stream

pytestmark = [
    pytest.mark.filterwarnings("error::SyntaxWarning"),
    pytest.mark.filterwarnings("error::DeprecationWarning"),
]

RM = '<tool_call>\n{"name": "rm", "arguments": {"path": "/"}}\n</tool_call>'
RM_XML = "<tool_call>\n<function=rm>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>"

# Every way a call can sit inside a thought. None of them may ever run.
CALLS_IN_THOUGHTS = {
    "closed": f"<think>Maybe {RM}? No.</think>Nothing to delete.",
    "closed_xml": f"<think>Maybe {RM_XML}? No.</think>Nothing to delete.",
    "closed_tools_tag": '<think>Or <tools>{"name": "rm", "arguments": {}}</tools></think>No.',
    "unclosed": f"<think>I could {RM}",
    "unclosed_then_special_token": f"<think>I could {RM}<|im_end|>",
    "pre_opened": f"The user wants it gone. {RM} Hmm, no.\n</think>\n\nNothing to delete.",
    "pre_opened_unclosed_block": 'Let me <tool_call>{"name": "rm"}</think>Nothing to delete.',
    "repeated_open_tag": f"<think><think>{RM}</think>Nothing to delete.",
    # Quotes mean nothing in a thought: an open string cannot carry the call past </think>.
    "string_never_closed": '<think><tool_call>{"name": "rm", "arguments": {"p": "</think>"}}',
}


def rm_agent(script: list[str], chunk_size: int = 3) -> tuple[Agent, list[str]]:
    ran: list[str] = []
    agent = Agent(model=ScriptedModel(script, chunk_size=chunk_size))

    @agent.tool
    def rm(path: str) -> str:
        """Delete a path."""
        ran.append(path)
        return "deleted"

    return agent, ran


async def run_collecting(agent: Agent, message: str, stream: bool) -> tuple[RunResult, list[Any]]:
    events: list[Any] = []
    result = await agent.arun(message, stream=stream, listener=events.append)
    return result, events


@pytest.mark.parametrize("streamed", [False, True], ids=["one_shot", "streamed"])
@pytest.mark.parametrize("text", list(CALLS_IN_THOUGHTS.values()), ids=list(CALLS_IN_THOUGHTS))
def test_a_call_inside_a_thought_never_reaches_the_tool_selector(text: str, streamed: bool) -> None:
    agent, ran = rm_agent([text, "Done."])
    result, events = asyncio.run(run_collecting(agent, "Delete everything.", streamed))
    assert ran == []
    assert all(record.name != "rm" for record in result.tool_calls)
    selections = [e for e in events if isinstance(e, SelectionEvent)]
    assert all(not s.planned and not s.rejected for s in selections)
    step = result.steps[0]
    assert step.thought is not None and "rm" in step.thought
    assert any(NOTE_CALL_IN_THOUGHT in note for note in step.notes)
    thought_events = [e for e in events if isinstance(e, ThoughtEvent)]
    assert thought_events[0].thought == step.thought and thought_events[0].notes == step.notes
    if streamed:
        # The stream never reported a parsed call, except where a bare </think> came after
        # one and voided it (its event says so).
        parsed = [e for e in events if isinstance(e, ToolCallParsedEvent) and e.name == "rm"]
        revealed = [e for e in events if isinstance(e, ThoughtDeltaEvent) and e.revealed]
        assert not parsed or revealed


def test_thought_is_kept_apart_and_streamed_as_thought_deltas() -> None:
    agent, _ = rm_agent(["<think>\nNo tool needed.\n</think>\n\nHello there."])
    result, events = asyncio.run(run_collecting(agent, "Hi", True))
    assert result.output == "Hello there."
    assert result.steps[0].thought == "No tool needed."
    thought = "".join(e.text for e in events if isinstance(e, ThoughtDeltaEvent))
    assert thought.strip() == "No tool needed."
    text = "".join(e.text for e in events if isinstance(e, TextDeltaEvent))
    assert text.strip() == "Hello there." and "think" not in text
    assert ThoughtDeltaEvent("x").to_dict() == {
        "kind": "thought_delta",
        "text": "x",
        "revealed": False,
    }


def test_thoughts_are_not_sent_back_to_the_model() -> None:
    model = ScriptedModel([f"<think>secret plan</think>{RM}", "Done."])
    agent = Agent(model=model)

    @agent.tool
    def rm(path: str) -> str:
        """Delete a path."""
        return "deleted"

    agent.run("Delete /")
    second = model.requests[1].messages
    assert all("secret plan" not in (m.content or "") for m in second)
    assert [c.name for m in second for c in m.tool_calls] == ["rm"]


def test_a_pre_opened_thought_becomes_the_thought_when_streamed() -> None:
    agent, _ = rm_agent(["The user greets me.\n</think>\n\nHello!"])
    result, events = asyncio.run(run_collecting(agent, "Hi", True))
    assert result.output == "Hello!"
    assert result.steps[0].thought == "The user greets me."
    assert any(NOTE_REVEALED_THOUGHT in note for note in result.steps[0].notes)
    (revealed,) = [e for e in events if isinstance(e, ThoughtDeltaEvent) and e.revealed]
    assert revealed.text.strip() == "The user greets me."


def test_feeding_the_opening_tag_first_streams_a_pre_opened_thought_cleanly() -> None:
    text = f"Delete it? {RM} No.</think>Nothing to do."
    parser = StreamParser()
    events = parser.feed("<think>")
    for chunk in split(text, list(range(0, len(text), 5))):
        events += parser.feed(chunk)
    events += parser.flush()
    assert not any(isinstance(e, ThoughtRevealed | ToolCallFinished) for e in events)
    assert "".join(e.text for e in events if isinstance(e, ThoughtDelta)).startswith("Delete it?")
    completion = parser.close()
    assert completion.content == "Nothing to do." and completion.tool_calls == []
    assert completion.notes == [NOTE_CALL_IN_THOUGHT]


# --- Qwen3-Coder XML calls, typed by the schema ---------------------------------------------


def xml_call(name: str, **values: str) -> str:
    parameters = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


def booking_agent(script: list[str]) -> tuple[Agent, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    agent = Agent(model=ScriptedModel(script))
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "nights": {"type": "integer"},
            "budget": {"type": ["number", "null"]},
            "breakfast": {"type": "boolean"},
            "guests": {"type": "array", "items": {"type": "string"}},
            "extras": {"$ref": "#/$defs/Extras"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["city", "nights"],
        "additionalProperties": False,
        "$defs": {
            "Extras": {
                "type": "object",
                "properties": {"late_checkout": {"type": "boolean"}},
                "additionalProperties": False,
            }
        },
    }

    @agent.register_tool(name="book", description="Book a hotel.", parameters=schema)
    def book(**arguments: Any) -> str:
        seen.append(arguments)
        return "booked"

    return agent, seen


def test_xml_values_are_typed_by_the_schema() -> None:
    call = xml_call(
        "book",
        city="1984",
        nights="3",
        budget="120.5",
        breakfast="true",
        guests='["Ana", "Bo"]',
        extras='{"late_checkout": True}',
        note="null",
    )
    agent, seen = booking_agent([call, "Booked."])
    result = agent.run("Book it.")
    assert result.status == 200, result.tool_calls
    assert seen == [
        {
            "city": "1984",  # a string stays a string, however it looks
            "nights": 3,
            "budget": 120.5,
            "breakfast": True,
            "guests": ["Ana", "Bo"],
            "extras": {"late_checkout": True},
            "note": "null",  # a string is allowed: the text stays text
        }
    ]


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"city": "Oslo", "nights": "three"}, "parameter 'nights' must be integer"),
        ({"city": "Oslo", "nights": "2", "breakfast": "yes"}, "parameter 'breakfast' must be"),
        ({"city": "Oslo", "nights": "2", "guests": "Ana, Bo"}, "must be array"),
        ({"city": "Oslo", "nights": "2.5"}, "parameter 'nights' must be integer"),
        ({"city": "Oslo", "nights": "2", "pets": "1"}, "'pets'"),  # then the schema check
    ],
)
def test_an_xml_value_that_does_not_fit_is_a_400_the_model_reads(
    values: dict[str, str], says: str
) -> None:
    agent, seen = booking_agent([xml_call("book", **values), "I could not book it."])
    result = agent.run("Book it.")
    assert seen == []
    (record,) = result.tool_calls
    assert record.status_code == 400 and record.error is not None
    assert says in record.error, record.error
    if "must be" in says:
        assert "write the value as JSON" in record.error


def test_a_json_call_is_not_typed_again() -> None:
    call = '<tool_call>{"name": "book", "arguments": {"city": "Oslo", "nights": "3"}}</tool_call>'
    agent, seen = booking_agent([call, "No."])
    (record,) = agent.run("Book it.").tool_calls
    assert seen == [] and record.status_code == 400  # "3" is a string in JSON: refused as before


def test_typed_arguments_leaves_undescribed_values_alone() -> None:
    typed, problems = typed_arguments({"x": "1", "y": "2"}, {"properties": {"y": {}}})
    assert (typed, problems) == ({"x": "1", "y": "2"}, [])
    typed, problems = typed_arguments({"e": "2"}, {"properties": {"e": {"enum": [1, 2]}}})
    assert (typed, problems) == ({"e": 2}, [])


# --- <tools> and the missing-comma list, through the agent -------------------------------------


def test_tools_tag_runs_and_a_definition_in_it_is_refused() -> None:
    definition = (
        '<tools>{"type": "function", "function": {"name": "rm", "description": "Delete.", '
        '"parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}</tools>'
    )
    agent, ran = rm_agent(['<tools>{"name": "rm", "arguments": {"path": "/tmp/x"}}</tools>', "ok"])
    assert agent.run("Delete /tmp/x").status == 200 and ran == ["/tmp/x"]
    agent, ran = rm_agent([definition, "ok"])
    result = agent.run("What can you do?")
    assert ran == []
    (record,) = result.tool_calls
    assert record.status_code == 400 and "tool definition" in (record.error or "")


def test_a_list_missing_its_commas_runs_every_call() -> None:
    text = (
        '<tool_call>[{"name": "rm", "arguments": {"path": "a"}} '
        '{"name": "rm", "arguments": {"path": "b"}}]</tool_call>'
    )
    agent, ran = rm_agent([text, "ok"])
    agent.run("Delete a and b")
    assert sorted(ran) == ["a", "b"]


# --- native mode: the server's reasoning field ----------------------------------------------


def native_model(replies: list[dict[str, Any]], mode: str = "native") -> OpenAICompatible:
    """An endpoint model whose server answers each request with the next scripted message
    (``content``, ``reasoning_content``/``reasoning``, ``tool_calls``), as JSON or SSE."""
    queue = list(replies)

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        message = queue.pop(0)
        if not body.get("stream"):
            payload = {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", **message},
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
            return httpx.Response(200, json=payload)
        events = []
        for key in ("reasoning_content", "reasoning", "content"):
            text = message.get(key) or ""
            events += [{key: text[i : i + 3]} for i in range(0, len(text), 3)]
        for n, call in enumerate(message.get("tool_calls", [])):
            events.append({"tool_calls": [{"index": n, **call}]})
        lines = [
            "data: "
            + json.dumps(
                {
                    "id": "x",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                }
            )
            for delta in events
        ]
        sse = "\n\n".join([*lines, "data: [DONE]"]) + "\n\n"
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})

    client = AsyncOpenAI(
        base_url="http://endpoint.test/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
    )
    return OpenAICompatible("m", mode=mode, client=client)  # type: ignore[arg-type]


def native_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


REASONING_CASES = {
    "reasoning_content": {"reasoning_content": "The user says hi.", "content": "Hello!"},
    "reasoning": {"reasoning": "The user says hi.", "content": "Hello!"},
    "with_a_call": {
        "reasoning_content": "I should look.",
        "content": "",
        "tool_calls": [native_call("rm", {"path": "/tmp/x"})],
    },
    # A call written in the reasoning, and a </think> trying to end it early: still a thought.
    "call_in_reasoning": {
        "reasoning_content": f"Maybe {RM} or </think>{RM} no.",
        "content": "Nothing to delete.",
    },
}


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("reply", list(REASONING_CASES.values()), ids=list(REASONING_CASES))
def test_native_reasoning_is_the_steps_thought(reply: dict[str, Any], streamed: bool) -> None:
    ran: list[str] = []
    agent = Agent(model=native_model([reply, {"content": "Done."}]))

    @agent.tool
    def rm(path: str) -> str:
        """Delete a path."""
        ran.append(path)
        return "deleted"

    result, events = asyncio.run(run_collecting(agent, "Hi", streamed))
    reasoning = reply.get("reasoning_content") or reply["reasoning"]
    step = result.steps[0]
    assert step.thought is not None
    assert step.thought.replace("</think >", "</think>") == reasoning
    assert f"<think>\n{reasoning[:5]}" in step.completion_text  # the trail shows it
    assert ran == (["/tmp/x"] if reply.get("tool_calls") else [])
    if RM in reasoning:
        assert any(NOTE_CALL_IN_THOUGHT in note for note in step.notes)
    if streamed:
        thought = "".join(e.text for e in events if isinstance(e, ThoughtDeltaEvent))
        assert thought.strip().replace("</think >", "</think>") == reasoning


def test_native_stream_parses_like_complete_with_reasoning() -> None:
    reply = REASONING_CASES["call_in_reasoning"]
    one = asyncio.run(native_model([reply]).complete([], [], ModelSettings()))
    chunks = asyncio.run(_collect(native_model([reply])))
    joined = parse_completion("".join(c.text for c in chunks))
    assert (joined.content, joined.thought, joined.notes) == (
        one.completion.content,
        one.completion.thought,
        one.completion.notes,
    )
    assert joined.tool_calls == one.completion.tool_calls == []


async def _collect(model: OpenAICompatible) -> list[Any]:
    return [chunk async for chunk in model.stream([], [], ModelSettings())]


# --- property tests: any chunking of the new forms ------------------------------------------

# Text with no "<" in it: prose of a thought, of an answer, or of an XML value.
plain = st.text(
    alphabet=st.sampled_from([*string.ascii_letters, *" \n.,:;!?{}[]\"'>/|_=", "東", "京"]),
    max_size=24,
)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
xml_values = st.dictionaries(names, plain, max_size=3)
json_arguments = st.dictionaries(names, st.integers() | plain, max_size=3)


@st.composite
def thinking_completions(draw: st.DrawFn) -> tuple[str, Completion]:
    """A completion in the forms of issue 27, and what it must parse to (calls by name and
    arguments; content; thought)."""
    pieces: list[str] = []
    content: list[str] = []
    calls: list[tuple[str, dict[str, Any]]] = []
    thoughts: list[str] = []
    lead = draw(st.sampled_from(["none", "think", "pre_opened"]))
    if lead != "none":
        thought = draw(plain).strip()
        inner = draw(st.sampled_from(["", RM, RM_XML]))
        opening = "<think>\n" if lead == "think" else ""
        pieces.append(f"{opening}{thought} {inner}\n</think>\n\n")
        if (thought + " " + inner).strip():
            thoughts.append((thought + " " + inner).strip())
    for _ in range(draw(st.integers(0, 3))):
        text = draw(plain)
        pieces.append(text)
        content.append(text)
        form = draw(st.sampled_from(["xml", "tools", "missing_commas"]))
        name = draw(names)
        if form == "xml":
            values = draw(xml_values)
            pieces.append(xml_call(name, **values))
            calls.append((name, values))
        else:
            arguments = draw(json_arguments)
            call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
            if form == "tools":
                pieces.append(f"<tools>\n{call}\n</tools>")
            else:
                pieces.append(f"<tool_call>[{call} {call}]</tool_call>")
                calls.append((name, arguments))
            calls.append((name, arguments))
    tail = draw(plain)
    pieces.append(tail)
    content.append(tail)
    expected = Completion(
        content="".join(content).strip(),
        tool_calls=[],
        thought="\n".join(thoughts) if thoughts else None,
    )
    expected.tool_calls = [_spec(name, arguments) for name, arguments in calls]
    return "".join(pieces), expected


def _spec(name: str, arguments: dict[str, Any]) -> Any:
    from hermes_agent.types import ToolCall

    return ToolCall(name, arguments, id="")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(thinking_completions(), st.data())
def test_new_forms_parse_as_rendered_and_any_chunking_agrees(
    sample: tuple[str, Completion], data: Any
) -> None:
    text, expected = sample
    got = parse_completion(text)
    assert got.errors == []
    assert [(c.name, c.arguments) for c in got.tool_calls] == [
        (c.name, c.arguments) for c in expected.tool_calls
    ]
    assert got.content == expected.content
    assert (got.thought or "").split() == (expected.thought or "").split()
    assert all(c.name != "rm" for c in got.tool_calls)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=max(1, len(text) // 3)))
    assert_any_chunking_agrees(text, cuts)


@settings(max_examples=100, deadline=None)
@given(thinking_completions())
def test_new_forms_one_character_at_a_time(sample: tuple[str, Completion]) -> None:
    text, _ = sample
    assert_any_chunking_agrees(text, list(range(len(text))))


# --- linear cost with thoughts ------------------------------------------------------------------


def _thinking_completion(n: int) -> str:
    thought = ("Let me think about <b> and a < c. " + RM + " maybe.\n") * n
    body = (
        "Answer part. " + xml_call("f", a="1", b='{"k": "</tool_call>"}') + "\n"
        '<tools>{"name": "g", "arguments": {}}</tools>\n'
    ) * n
    return f"<think>{thought}</think>{body}"


@pytest.mark.parametrize("make", [_thinking_completion, lambda n: _thinking_completion(n)[7:]])
@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_scanner_work_stays_linear_with_thoughts(
    make: Callable[[int], str], chunk_size: int
) -> None:
    per_char = []
    for n in (10, 100, 1000):
        text = make(n)  # with <think>, and pre-opened (a bare </think> reveals it)
        parser = StreamParser(new_id=counter_ids())
        chunks = split(text, list(range(0, len(text), chunk_size)))
        for chunk in chunks:
            parser.feed(chunk)
        completion = parser.close()
        assert len(completion.tool_calls) == 2 * n and completion.thought
        assert parser._chars_scanned <= 2 * len(text) + 16 * len(chunks)
        per_char.append(parser._chars_scanned / len(text))
    assert per_char[-1] <= per_char[0] * 1.05
    assert stream(split(make(10), [5, 50, 500]))[0] == parse_completion(
        make(10), new_id=counter_ids()
    )
