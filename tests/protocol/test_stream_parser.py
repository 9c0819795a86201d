"""StreamParser: any chunking gives parse_completion's result, with well-formed events."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_agent.protocol.chatml import to_json
from hermes_agent.protocol.parser import (
    SPECIAL_TOKENS,
    ScratchPadDelta,
    StreamEvent,
    StreamParser,
    TextDelta,
    ThoughtDelta,
    ThoughtRevealed,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
    parse_completion,
)
from hermes_agent.types import Completion

# The case table and the generators live in test_parser.py. Its import name depends on how
# pytest puts tests/ on sys.path (rootdir-relative package or plain directory).
try:
    from test_parser import CASES, completions, counter_ids, soup
except ImportError:  # pragma: no cover - tests/ is a package
    from tests.test_parser import CASES, completions, counter_ids, soup

# Warnings the parser itself could raise (escape sequences in literal_eval, deprecations) are
# errors; ResourceWarnings from other tests' sockets collected meanwhile are not ours.
pytestmark = [
    pytest.mark.filterwarnings("error::SyntaxWarning"),
    pytest.mark.filterwarnings("error::DeprecationWarning"),
]

TAGS = (
    "<tool_call>", "</tool_call>", "<tools>", "</tools>", "<scratch_pad>", "</scratch_pad>",
    "<think>", "</think>", *SPECIAL_TOKENS,
)  # fmt: skip
CASE_TEXTS = [pytest.param(c.values[0], id=c.id) for c in CASES]


def split(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def stream(chunks: list[str]) -> tuple[Completion, list[StreamEvent]]:
    parser = StreamParser(new_id=counter_ids())
    events: list[StreamEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.flush()
    return parser.close(), events


def squeeze(text: str) -> str:
    """``text`` without blanks and special tokens."""
    for token in SPECIAL_TOKENS:
        text = text.replace(token, "")
    return "".join(text.split())


def check_events(completion: Completion, events: list[StreamEvent]) -> None:
    """The invariants every event stream keeps."""
    reveals = [n for n, e in enumerate(events) if isinstance(e, ThoughtRevealed)]
    assert len(reveals) <= 1
    # A reveal voids the content and calls streamed before it; what follows it must add up.
    after = events[reveals[0] + 1 :] if reveals else events
    texts = [e.text for e in after if isinstance(e, TextDelta)]
    assert "".join(texts).strip() == completion.content
    assert all(text and not any(tag in text for tag in TAGS) for text in texts)
    # The thought: the revealed text and the deltas, up to blanks (each thought is stripped,
    # several are joined with newlines, an unclosed one loses trailing special tokens).
    assert all(e.text for e in events if isinstance(e, ThoughtDelta))
    streamed = "".join(e.text for e in events if isinstance(e, ThoughtRevealed | ThoughtDelta))
    assert squeeze(streamed) == squeeze(completion.thought or "")
    # Per block: Started, then deltas, then one or more Finished; blocks numbered 0, 1, ...
    state: dict[int, str] = {}
    for event in events:
        if isinstance(event, ToolCallStarted):
            assert event.index == len(state)
            state[event.index] = "open"
        elif isinstance(event, ToolCallArgumentsDelta):
            assert state.get(event.index) == "open"
            assert event.delta
        elif isinstance(event, ToolCallFinished):
            assert state.get(event.index) in ("open", "finished")
            assert (event.call is None) != (event.error is None)
            state[event.index] = "finished"
    assert all(s == "finished" for s in state.values())
    finished = [e for e in after if isinstance(e, ToolCallFinished)]
    assert [e.call for e in finished if e.call] == completion.tool_calls
    assert [e.error for e in finished if e.error] == completion.errors


def assert_any_chunking_agrees(text: str, cuts: list[int]) -> None:
    expected = parse_completion(text, new_id=counter_ids())
    got, events = stream(split(text, cuts))
    assert got == expected  # ids too: both draw them from a fresh counter in block order
    check_events(got, events)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(completions(), st.data())
def test_rendered_completions_any_chunking(sample: tuple[str, Completion], data: Any) -> None:
    text, _ = sample
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=max(1, len(text) // 3)))
    assert_any_chunking_agrees(text, cuts)


@settings(max_examples=300)
@given(soup, st.data())
def test_broken_text_any_chunking(text: str, data: Any) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=max(1, len(text))))
    assert_any_chunking_agrees(text, cuts)


@pytest.mark.parametrize("text", CASE_TEXTS)
@settings(max_examples=40)
@given(data=st.data())
def test_table_cases_any_chunking(text: str, data: Any) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=len(text) + 1))
    assert_any_chunking_agrees(text, cuts)


@pytest.mark.parametrize("text", CASE_TEXTS)
def test_table_cases_one_character_at_a_time(text: str) -> None:
    assert_any_chunking_agrees(text, list(range(len(text))))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(completions(), st.data())
def test_arguments_deltas_are_the_raw_block(sample: tuple[str, Completion], data: Any) -> None:
    text, expected = sample
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=max(1, len(text) // 3)))
    _, events = stream(split(text, cuts))
    blocks: dict[int, str] = {}
    for event in events:
        if isinstance(event, ToolCallArgumentsDelta):
            blocks[event.index] = blocks.get(event.index, "") + event.delta
    rendered = [
        f"\n{to_json({'name': c.name, 'arguments': c.arguments})}\n" for c in expected.tool_calls
    ]
    assert [blocks.get(i, "") for i in range(len(rendered))] == rendered


def test_tag_split_across_chunks_is_held_back() -> None:
    parser = StreamParser()
    assert parser.feed("Hi <tool_ca") == [TextDelta("Hi ")]
    assert parser.feed("ll>") == [ToolCallStarted(0)]
    assert parser.feed('{"name": "f"}</tool') == [ToolCallArgumentsDelta(0, '{"name": "f"}')]
    finished, text = parser.feed("_call> bye <")
    assert isinstance(finished, ToolCallFinished)
    assert finished.index == 0 and finished.call is not None and finished.call.name == "f"
    assert text == TextDelta(" bye ")  # "<" may start a tag: held back
    assert parser.flush() == [TextDelta("<")]
    assert parser.close().content == "Hi  bye <"


def test_not_a_tag_after_all_is_released_as_text() -> None:
    parser = StreamParser()
    assert parser.feed("a <tool") == [TextDelta("a ")]
    assert parser.feed("box> b") == [TextDelta("<toolbox> b")]


def test_special_token_split_across_chunks_is_dropped() -> None:
    chunks = ["Done.<|im", "_e", "nd|>"]
    completion, events = stream(chunks)
    assert events == [TextDelta("Done.")]
    assert completion.content == "Done."


def test_scratch_pad_events() -> None:
    completion, events = stream(["<scratch", "_pad>pl", "an</scratch_", "pad>ok"])
    assert events == [ScratchPadDelta("pl"), ScratchPadDelta("an"), TextDelta("ok")]
    assert completion.scratch_pad == "plan"


def test_close_tag_inside_string_does_not_end_the_block() -> None:
    text = '<tool_call>{"name": "echo", "arguments": {"t": "</tool_call>"}}</tool_call>'
    completion, events = stream(list(text))
    assert [c.arguments for c in completion.tool_calls] == [{"t": "</tool_call>"}]
    assert sum(isinstance(e, ToolCallFinished) for e in events) == 1


def test_unclosed_final_block_finishes_on_flush() -> None:
    parser = StreamParser()
    parser.feed('<tool_call>{"name": "f", "arguments": {}}')
    (finished,) = parser.flush()
    assert isinstance(finished, ToolCallFinished) and finished.call is not None
    assert parser.close().tool_calls == [finished.call]


def test_list_block_finishes_once_per_call() -> None:
    _, events = stream(['<tool_call>[{"name": "a"}, {"name": "b"}, 3]</tool_call>'])
    finished = [e for e in events if isinstance(e, ToolCallFinished)]
    assert [(e.index, e.call.name if e.call else None) for e in finished] == [
        (0, "a"),
        (0, "b"),
        (0, None),
    ]


def test_lifecycle() -> None:
    parser = StreamParser()
    parser.feed("x")
    first = parser.close()
    assert parser.flush() == []
    assert parser.close() is first
    with pytest.raises(RuntimeError):
        parser.feed("y")


# --- linear cost, counted rather than timed --------------------------------------------------


def _long_completion(n_blocks: int) -> str:
    block = (
        'Some text with a < sign. <tool_call>\n{"name": "search", "arguments": '
        '{"query": "a </tool_call> inside {braces}", "n": 3}}\n</tool_call>\n'
    )
    return "<scratch_pad>plan</scratch_pad>" + block * n_blocks + '<tool_call>{"name": \'x'


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_scanner_work_is_linear(chunk_size: int) -> None:
    longest = max(len(tag) for tag in TAGS)
    per_char = []
    for n_blocks in (10, 100, 1000):
        text = _long_completion(n_blocks)
        parser = StreamParser()
        chunks = split(text, list(range(0, len(text), chunk_size)))
        for chunk in chunks:
            parser.feed(chunk)
        parser.close()
        scanned = parser._chars_scanned
        # Each character once, plus at most one held-back tag per chunk, plus one recovery.
        assert scanned <= 2 * len(text) + longest * len(chunks)
        per_char.append(scanned / len(text))
    assert per_char[-1] <= per_char[0] * 1.05
