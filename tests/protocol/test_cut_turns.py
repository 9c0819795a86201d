"""A turn cut short never runs its calls, and a call the parser does not accept is the model's to
fix, never the user's to read.

A completion that ended on ``max_tokens`` (finish reason ``length``) runs none of its calls —
a Qwen3 XML call cut inside its last ``<parameter>`` still parses, with the cut value — and each
becomes a parse error the model reads (a bounded retry like any malformed turn). A bare
``<function=...>`` with no ``<tool_call>`` around it is a parse error too. Both through the
shared pipeline (streamed and not), a real OpenAI-compatible server on loopback, and the
queued engine's journal."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_agent import Agent, ScriptedModel
from hermes_agent.models.base import ModelSettings
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.pipeline.status import Status
from hermes_agent.protocol.parser import (
    BARE_FUNCTION,
    StreamParser,
    TextDelta,
    ToolCallFinished,
    parse_completion,
)
from hermes_agent.testing import tool_call as call
from hermes_agent.types import Message, ModelResponse, RunResult, StreamChunk
from hermes_agent.worker.journal import response_from_json, response_to_json
from openai_server import (  # noqa: F401  (the fixtures)
    Reply,
    ScriptedServer,
    running_fixture,
    server_fixture,
    text,
)

XML_CUT = (
    "<tool_call>\n<function=write_file>\n<parameter=path>\nnotes.txt\n</parameter>\n"
    "<parameter=content>\nline 1\nline"
)
"""The issue's turn: cut at max_tokens inside the last parameter's value. It parses."""
WHOLE = call("write_file", path="notes.txt", content="line 1\nline 2\n")


class CutModel(ScriptedModel):
    """A scripted model that says which of its turns ran into ``max_tokens``: the turns whose
    index (from 0) is in ``cut`` end with finish reason ``length``, the others ``stop``."""

    def __init__(self, script: Sequence[str], cut: set[int], **options: Any) -> None:
        super().__init__(script, **options)
        self.cut = cut
        self.turns = 0

    def _finish(self) -> str:
        self.turns += 1
        return "length" if self.turns - 1 in self.cut else "stop"

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], s: ModelSettings
    ) -> ModelResponse:
        response = await super().complete(messages, tools, s)
        response.finish_reason = self._finish()
        return response

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], s: ModelSettings
    ) -> AsyncIterator[StreamChunk]:
        async for chunk in super().stream(messages, tools, s):
            if chunk.usage is not None:
                chunk.finish_reason = self._finish()
            yield chunk


def writing_agent(model: Any) -> tuple[Agent, list[dict[str, str]]]:
    written: list[dict[str, str]] = []
    agent = Agent(model=model)

    @agent.tool
    def write_file(path: str, content: str) -> str:
        """Write a file."""
        written.append({"path": path, "content": content})
        return "written"

    return agent, written


def run(agent: Agent, *, stream: bool = False) -> RunResult:
    return asyncio.run(agent.arun("write the notes", stream=stream))


# -- the pipeline ------------------------------------------------------------------------------


def test_the_cut_xml_call_parses_with_the_cut_value() -> None:
    """Why the finish reason must be read: the parser alone cannot tell this call was cut."""
    (parsed,) = parse_completion(XML_CUT).tool_calls
    assert parsed.arguments == {"path": "notes.txt", "content": "line 1\nline"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_cut_at_max_tokens_runs_none_of_its_calls_and_the_model_is_told(
    stream: bool,
) -> None:
    model = CutModel([XML_CUT, WHOLE, "Saved."], cut={0})
    agent, written = writing_agent(model)
    result = run(agent, stream=stream)
    assert result.status == 200 and result.output == "Saved."
    assert written == [{"path": "notes.txt", "content": "line 1\nline 2\n"}]  # only the whole one
    first = result.steps[0]
    assert first.status_code == Status.INVALID
    assert len(first.parse_errors) == 1 and "cut off at the token limit" in first.parse_errors[0]
    # The model read the refusal, and what it wrote, before its second turn.
    told = model.requests[1].messages[-1]
    assert told.role == "tool" and "none of its calls ran" in str(told.tool_results)
    assert [c.status_code for c in result.tool_calls] == [400, 200]


def test_every_call_of_a_cut_turn_is_held_back_not_only_the_last() -> None:
    whole_first = call("write_file", path="a.txt", content="a") + XML_CUT
    agent, written = writing_agent(CutModel([whole_first, "ok"], cut={0}))
    result = run(agent)
    assert written == []
    assert len(result.steps[0].parse_errors) == 2


def test_a_model_that_is_always_cut_off_stops_after_its_retries_and_nothing_ran() -> None:
    agent, written = writing_agent(CutModel([XML_CUT] * 3, cut={0, 1, 2}))
    result = run(agent)
    assert written == []
    assert result.status == Status.MODEL_ERROR and result.loop_status == "failed"
    assert len(result.steps) == 3  # max_retries (2) + 1


def test_the_same_turn_that_ended_normally_still_runs() -> None:
    """The finish reason, not the shape of the text, decides (an unclosed final block is
    accepted when the model stopped there itself)."""
    agent, written = writing_agent(CutModel([XML_CUT, "ok"], cut=set()))
    run(agent)
    assert written == [{"path": "notes.txt", "content": "line 1\nline"}]


_VALUE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@st.composite
def cut_call(draw: st.DrawFn) -> str:
    """A whole call, JSON or Qwen3 XML, cut at any point."""
    path, content = draw(_VALUE), draw(_VALUE)
    if draw(st.booleans()):
        whole = call("write_file", path=path, content=content)
    else:
        whole = (
            f"<tool_call>\n<function=write_file>\n<parameter=path>\n{path}\n</parameter>\n"
            f"<parameter=content>\n{content}\n</parameter>\n</function>\n</tool_call>"
        )
    return whole[: draw(st.integers(0, len(whole)))]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=cut_call(), stream=st.booleans())
def test_no_call_of_a_turn_cut_at_max_tokens_ever_runs(text: str, stream: bool) -> None:
    agent, written = writing_agent(CutModel([text, "done"], cut={0}, chunk_size=7))
    run(agent, stream=stream)
    assert written == []


# -- a bare <function=...> ---------------------------------------------------------------------


BARE = "Sure.\n<function=write_file>\n<parameter=path>\nx.txt\n</parameter>\n</function>"


def test_a_bare_function_call_is_a_parse_error_not_content() -> None:
    parsed = parse_completion(BARE)
    assert parsed.content == "Sure." and parsed.tool_calls == []
    (error,) = parsed.errors
    assert error.message == BARE_FUNCTION and error.block.startswith("<function=write_file>")
    # Streamed in any chunks, the same completion, and no piece of the call as text.
    for size in (1, 3, 17):
        parser = StreamParser()
        events = [e for i in range(0, len(BARE), size) for e in parser.feed(BARE[i : i + size])]
        events += parser.flush()
        assert parser.close() == parsed
        shown = "".join(e.text for e in events if isinstance(e, TextDelta))
        assert shown.strip() == "Sure."
        assert [e.error for e in events if isinstance(e, ToolCallFinished)] == [error]


def test_an_unclosed_bare_function_runs_to_the_end_and_several_are_each_reported() -> None:
    parsed = parse_completion("a <function=f>x</function> b <function=g><parameter=q>1")
    assert parsed.content == "a  b"
    assert [e.block for e in parsed.errors] == [
        "<function=f>x</function>",
        "<function=g><parameter=q>1",
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_a_bare_function_reaches_the_model_as_an_error_and_never_the_user(stream: bool) -> None:
    model = ScriptedModel([BARE, "Done: x.txt written."])
    agent, written = writing_agent(model)
    result = run(agent, stream=stream)
    assert result.output == "Done: x.txt written."
    assert "<function=" not in result.output and written == []
    assert result.steps[0].parse_errors == [BARE_FUNCTION]
    assert "outside <tool_call>" in str(model.requests[1].messages[-1].tool_results)


# -- a real OpenAI-compatible server ------------------------------------------------------------


def _cut_body(content: str) -> str:
    choice = {"index": 0, "message": {"role": "assistant", "content": content}}
    return json.dumps({"choices": [{**choice, "finish_reason": "length"}]})


def _cut_stream(content: str) -> list[str]:
    pieces = [content[i : i + 9] for i in range(0, len(content), 9)]
    chunks = [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    return [json.dumps(c) for c in chunks]


@pytest.mark.parametrize("stream", [False, True])
def test_an_endpoint_turn_cut_at_max_tokens_runs_none_of_its_calls(
    server: ScriptedServer, stream: bool
) -> None:
    cut = Reply(raw_chunks=_cut_stream(XML_CUT)) if stream else Reply(raw=_cut_body(XML_CUT))
    server.push(cut, text("I ran out of room; nothing was written."))
    model = OpenAICompatible("test-model", base_url=server.base_url, max_retries=0)
    agent, written = writing_agent(model)
    result = run(agent, stream=stream)
    agent.close()
    assert written == []
    assert result.output == "I ran out of room; nothing was written."
    assert "cut off at the token limit" in result.steps[0].parse_errors[0]
    assert [r.get("stream", False) for r in server.requests] == [stream, stream]


# -- the queued engine's journal ----------------------------------------------------------------


def test_a_journaled_turn_keeps_its_finish_reason() -> None:
    """A resumed queued run replays its turns from the journal: a cut turn must stay cut."""
    response = ModelResponse(parse_completion(XML_CUT), XML_CUT, finish_reason="length")
    again = response_from_json(json.loads(json.dumps(response_to_json(response))))
    assert again.finish_reason == "length" and again.completion == response.completion
