"""Parser fuzzing: deep nesting, and generated completions of every shape the parser reads.

Two promises are checked here: ``parse_completion`` never raises, whatever the text, and
``StreamParser`` agrees with it for any chunking (the comparison of
tests/protocol/test_stream_parser.py:
equal completions, ids included, and well-formed events). A block nested deeper than
``MAX_NESTING`` gets the same verdict on both paths, in every form a model can write one.

``random_completion`` builds the inputs from any ``random.Random``: the hypothesis test below
drives it with ``st.randoms()`` (so failures shrink), and benchmarks/fuzz_parser.py runs the same
generator over 100,000 seeded inputs.
"""

from __future__ import annotations

import asyncio
import json
import random
import string
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_agent import Agent, ScriptedModel
from hermes_agent.protocol.parser import (
    MAX_NESTING,
    NOTE_CALL_IN_THOUGHT,
    NOTE_REVEALED_THOUGHT,
    NOTE_UNCLOSED_THOUGHT,
    SPECIAL_TOKENS,
    parse_completion,
)
from hermes_agent.types import Completion

# The comparison lives in test_stream_parser.py; see there for why the import has two forms.
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

TOO_DEEP = f"nested too deeply (max depth {MAX_NESTING})"
OK_BLOCK = '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'


# --- deep nesting: the same verdict on both paths ---------------------------------------------


def deep_json(depth: int, *, closed: bool = True) -> str:
    """An object nesting ``depth`` levels: objects and arrays alternating, innermost ``1``."""
    opening = "".join('{"k": ' if level % 2 == 0 else "[" for level in range(depth))
    closing = "".join("}" if level % 2 == 0 else "]" for level in reversed(range(depth)))
    return opening + "1" + (closing if closed else "")


def deep_python(depth: int, *, closed: bool = True) -> str:
    """The Python-literal form: single-quoted keys, tuples, ``None``."""
    opening = "".join(
        "{'k': " if level % 3 == 0 else "(" if level % 3 == 1 else "[" for level in range(depth)
    )
    closing = "".join(
        "}" if level % 3 == 0 else ",)" if level % 3 == 1 else "]"
        for level in reversed(range(depth))
    )
    return opening + "None" + (closing if closed else "")


def deep_bodies(depth: int, closed: bool) -> dict[str, str]:
    """A block body nesting ``depth`` levels in total, in each form a model may write."""
    inner = depth - 1  # the call object itself is one level
    return {
        "arrays": "[" * depth + ("]" * depth if closed else ""),
        "objects": deep_json(depth, closed=closed),
        "python_dicts": deep_python(depth, closed=closed),
        "tuples": "(" * depth + ("1" + ")" * depth if closed else ""),
        "arguments": '{"name": "f", "arguments": '
        + deep_json(inner, closed=closed)
        + ("}" if closed else ""),
        "python_call": "{'name': 'f', 'arguments': "
        + deep_python(inner, closed=closed)
        + ("}" if closed else ""),
        # The arguments string is decoded separately: its own depth is what counts there.
        "double_encoded_arguments": '{"name": "f", "arguments": '
        + json.dumps(deep_json(depth, closed=closed))
        + "}",
        "whole_call_double_encoded": json.dumps(
            '{"name": "f", "arguments": ' + deep_json(inner, closed=closed) + "}"
        ),
        "list_of_calls": '[{"name": "f", "arguments": '
        + deep_json(depth - 2, closed=closed)
        + ("}]" if closed else ""),
        "trailing_commas": "[" * depth + "1" + (",]" * depth if closed else ","),
    }


SHAPES = tuple(deep_bodies(3, closed=True))
"""The forms of ``deep_bodies`` (the keys; the bodies are built in the test, not at collection:
100,000 levels take a while)."""

DEEP_CASES = [
    pytest.param(
        depth,
        closed,
        shape,
        ending,
        id=f"{shape}-{depth}-{'balanced' if closed else 'truncated'}-{ending_id}",
    )
    for depth in (MAX_NESTING + 1, 1_000)
    for closed in (True, False)
    for shape in SHAPES
    for ending_id, ending in (
        ("closing_tag", "</tool_call> Done."),
        ("no_closing_tag", ""),
        ("im_end", "<|im_end|>"),
    )
] + [
    pytest.param(
        100_000,
        closed,
        shape,
        "",
        id=f"{shape}-100000-{'balanced' if closed else 'truncated'}",
    )
    for shape in ("arrays", "python_dicts", "double_encoded_arguments")
    for closed in (True, False)
]


@pytest.mark.parametrize(("depth", "closed", "shape", "ending"), DEEP_CASES)
def test_deep_nesting_is_one_error_on_both_paths(
    depth: int, closed: bool, shape: str, ending: str
) -> None:
    body = deep_bodies(depth, closed)[shape]
    text = f"Checking. {OK_BLOCK}<tool_call>\n{body}\n{ending}"
    completion = parse_completion(text, new_id=counter_ids())  # raised RecursionError before
    assert [call.name for call in completion.tool_calls] == ["ok"]
    (error,) = completion.errors
    assert TOO_DEEP in error.message
    assert error.block.strip().startswith(body[:20].strip())
    # The stream parser, in token-sized and in random chunks, says exactly the same.
    assert_any_chunking_agrees(text, list(range(0, len(text), 4)))
    cuts = random.Random(len(text)).sample(range(len(text)), min(len(text), 50))
    assert_any_chunking_agrees(text, cuts)


@pytest.mark.parametrize(
    "call",
    [
        lambda inner: '{"name": "f", "arguments": ' + deep_json(inner) + "}",
        lambda inner: "{'name': 'f', 'arguments': " + deep_python(inner) + "}",
        lambda inner: '{"name": "f", "arguments": ' + json.dumps(deep_json(inner + 1)) + "}",
    ],
    ids=["json", "python", "double_encoded"],
)
def test_max_nesting_is_the_exact_limit(call: Callable[[int], str]) -> None:
    # The block's own object is one level, so the arguments may nest MAX_NESTING - 1.
    at_limit = f"<tool_call>{call(MAX_NESTING - 1)}</tool_call>"
    over = f"<tool_call>{call(MAX_NESTING)}</tool_call>"
    for text in (at_limit, over):
        assert_any_chunking_agrees(text, list(range(0, len(text), 7)))
    accepted = parse_completion(at_limit)
    assert accepted.errors == [] and [c.name for c in accepted.tool_calls] == ["f"]
    refused = parse_completion(over)
    assert refused.tool_calls == []
    assert [TOO_DEEP in e.message for e in refused.errors] == [True]


def test_brackets_inside_strings_do_not_count() -> None:
    deep_looking = "[{(" * 200
    text = (
        '<tool_call>{"name": "f", "arguments": {"a": "' + deep_looking + '", "b": \'x\'}}'
        "</tool_call>"
    )
    completion = parse_completion(text)
    assert completion.errors == []
    assert completion.tool_calls[0].arguments == {"a": deep_looking, "b": "x"}
    assert_any_chunking_agrees(text, list(range(0, len(text), 5)))


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "f", "arguments": {"n": ' + "7" * 5_000 + "}}</tool_call>",
        '<tool_call>{"name": "f", "arguments": {"n": ' + "7" * 5_000 + ",}}</tool_call>",
        '<tool_call>{"name": "f", "arguments": {"n": ' + "7" * 5_000 + "}}",
        '<tool_call>{"name": "f", "arguments": "{\\"n\\": ' + "7" * 5_000 + '}"}</tool_call>',
    ],
    ids=["fast_path", "trailing_comma", "unclosed", "double_encoded"],
)
def test_number_too_long_to_convert_is_a_parse_error(text: str) -> None:
    completion = parse_completion(text)  # raised ValueError from int() before
    assert completion.tool_calls == []
    (error,) = completion.errors
    assert "a number is too long" in error.message and "send it as a string" in error.message
    assert_any_chunking_agrees(text, list(range(0, len(text), 9)))


# --- the agent feeds the error back and goes on -------------------------------------------------

DEEP_CALL = (
    '<tool_call>\n{"name": "add", "arguments": ' + "[" * 1_000 + "]" * 1_000 + "}\n</tool_call>"
)


def deep_call_agent() -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel([DEEP_CALL, "I could not call the tool; 2 + 3 is 5 anyway."])
    agent = Agent(model=model)

    @agent.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return agent, model


def check_fed_back(result: Any, model: ScriptedModel) -> None:
    assert result.status == 200
    assert result.output == "I could not call the tool; 2 + 3 is 5 anyway."
    assert len(model.requests) == 2
    assert any(TOO_DEEP in message for message in result.steps[0].parse_errors)
    fed_back = model.requests[1].messages[-1]
    assert fed_back.role == "tool"
    (tool_result,) = fed_back.tool_results
    assert tool_result.status_code == 400 and tool_result.content["status"] == "error"
    assert "could not parse your tool call" in tool_result.content["error"]
    assert TOO_DEEP in tool_result.content["error"]


def test_agent_feeds_a_deeply_nested_call_back_as_a_400() -> None:
    agent, model = deep_call_agent()
    check_fed_back(agent.run("What is 2 + 3?"), model)


def test_agent_streaming_feeds_a_deeply_nested_call_back_as_a_400() -> None:
    agent, model = deep_call_agent()  # streamed: the StreamParser reads the completion
    check_fed_back(asyncio.run(agent.arun("What is 2 + 3?", stream=True)), model)


# --- the generator --------------------------------------------------------------------------

NAMES = ["get_weather", "search", "math.add", " padded ", "東京_lookup", "", "x" * 40]
WORDS = [
    "the", "weather", "in", "Tokyo", "東京", "天気", "is", "fine", "a < b", "<b>bold</b>", "{x}",
    "[1]", "(a)", "it's", 'say "hi"', "C:\\data", "\\n", "```", "# note", "🙂", "—", "\t",
]  # fmt: skip
TAG_BITS = [
    "<tool_call>", "</tool_call>", "<scratch_pad>", "</scratch_pad>", *SPECIAL_TOKENS,
    "<tool_", "</tool", "<|im", "<scratch", "<", "</", "<tool_call", "tool_call>",
    "<think>", "</think>", "<thin", "</thi", "<tools>", "</tools>", "<tools",
    "<function=", "</function>", "<parameter=", "</parameter>", "<function=f>",
]  # fmt: skip
# No capital letters: a fuzzed NaN would parse (JSON allows it) and never equal itself.
GARBAGE = string.ascii_lowercase + string.digits + " \n\t{}[]():,;'\"\\<>/|_-.#`=!東京天気…"
# A tool definition as the prompt lists it, echoed back (in <tools> it must not become a call).
DEFINITION = json.dumps(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
)
ENDINGS = ["</tool_call>", "</tool_call>", "</tool_call>", "", "<|im_end|>", "<|endoftext|>"]


class BigNumber:
    """A number with more digits than ``int()`` converts (rendered as text, never an int)."""

    def __init__(self, digits: int) -> None:
        self.text = "9" * digits


def random_string(rng: random.Random) -> str:
    parts = [
        rng.choice(WORDS) if rng.random() < 0.6 else rng.choice(TAG_BITS)
        for _ in range(rng.randint(0, 5))
    ]
    if rng.random() < 0.05:
        parts.append("\ud800")  # a lone surrogate: a str like any other to the parser
    return " ".join(parts)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.random() if depth < 4 else rng.random() * 0.7
    if kind < 0.1:
        return rng.choice([None, True, False])
    if kind < 0.25:
        return rng.choice([0, -1, 42, 10**20, 2.5, -0.001, 1e300])
    if kind < 0.27:
        return BigNumber(rng.choice([10, 4_301, 6_000]))
    if kind < 0.7:
        return random_string(rng)
    if kind < 0.8:
        return tuple(random_value(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    if kind < 0.9:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {random_string(rng): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def render(value: Any, rng: random.Random, python: bool) -> str:
    """``value`` as JSON or as a Python literal, spaced at random, with trailing commas."""
    space = rng.choice(["", " ", "\n  "])
    if value is None or isinstance(value, bool):
        words = {None: ("null", "None"), True: ("true", "True"), False: ("false", "False")}
        return words[value][python or rng.random() < 0.05]
    if isinstance(value, BigNumber):
        return value.text
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if python else json.dumps(value, ensure_ascii=rng.random() < 0.5)
    if isinstance(value, dict):
        items = [
            f"{render(k, rng, python)}:{space}{render(v, rng, python)}" for k, v in value.items()
        ]
        return "{" + space + f",{space}".join(items) + trailing(rng, items) + space + "}"
    items = [render(v, rng, python) for v in value]
    if isinstance(value, tuple) and python:
        return "(" + ", ".join(items) + ("," if len(items) == 1 else trailing(rng, items)) + ")"
    return "[" + f",{space}".join(items) + trailing(rng, items) + "]"


def trailing(rng: random.Random, items: list[str]) -> str:
    return "," if items and rng.random() < 0.1 else ""


def random_call(rng: random.Random, python: bool) -> str:
    arguments = {random_string(rng): random_value(rng, 1) for _ in range(rng.randint(0, 4))}
    call: dict[str, Any] = {"name": rng.choice(NAMES)}
    shape = rng.random()
    if shape < 0.6:
        call["arguments"] = arguments
    elif shape < 0.7:
        call["parameters"] = arguments
    elif shape < 0.8:  # double-encoded arguments
        call["arguments"] = render(arguments, rng, python=rng.random() < 0.3)
    elif shape < 0.85:
        call["arguments"] = rng.choice([None, "", [1, 2], 3])
    elif shape < 0.95:  # OpenAI-shaped
        call = {"type": "function", "function": {**call, "arguments": arguments}}
    if rng.random() < 0.2:
        call["id"] = rng.choice(["call_1", "call_1", "", "x"])
    keys = list(call)
    rng.shuffle(keys)
    return render({k: call[k] for k in keys}, rng, python)


def random_deep(rng: random.Random) -> str:
    depth = rng.choice([MAX_NESTING - 1, MAX_NESTING, MAX_NESTING + 1, 2 * MAX_NESTING, 1_000])
    closed = rng.random() < 0.7
    return rng.choice(list(deep_bodies(depth, closed).values()))


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 3)):
        if not text:
            break
        i = rng.randrange(len(text))
        action = rng.random()
        if action < 0.3:
            text = text[:i]
        elif action < 0.6:
            text = text[:i] + text[i + 1 :]
        elif action < 0.9:
            text = text[:i] + rng.choice(GARBAGE) + text[i:]
        else:
            text = text[:i] + text[i : i + rng.randint(1, 20)] * 2 + text[i:]
    return text


def garbage(rng: random.Random, size: int = 12) -> str:
    return "".join(rng.choice(GARBAGE) for _ in range(rng.randint(0, size)))


def random_xml_call(rng: random.Random) -> str:
    """A Qwen3-Coder XML call: text or JSON values, newlines or not, closing tags forgotten."""
    nl = rng.choice(["", "\n"])
    parts = [f"<function={rng.choice(NAMES)}>{nl}"]
    for _ in range(rng.randint(0, 4)):
        value = random_value(rng, 1)
        text = value if isinstance(value, str) else render(value, rng, python=False)
        close = "</parameter>" if rng.random() < 0.9 else ""
        parts.append(f"<parameter={rng.choice(NAMES)}>{nl}{text}{nl}{close}{nl}")
    if rng.random() < 0.9:
        parts.append("</function>")
    return "".join(parts)


def random_body(rng: random.Random) -> str:
    """What goes between ``<tool_call>`` and its end."""
    kind = rng.random()
    python = rng.random() < 0.25
    if kind < 0.3:
        body = random_call(rng, python)
    elif kind < 0.35:
        xml = [random_xml_call(rng) for _ in range(rng.randint(1, 2))]
        body = "\n".join(xml) if rng.random() < 0.8 else mutate("\n".join(xml), rng)
    elif kind < 0.45:
        calls = [random_call(rng, python) for _ in range(rng.randint(0, 3))]
        layout = rng.random()
        if layout < 0.4:
            body = "[" + ", ".join(calls) + "]"
        elif layout < 0.55:  # a list missing its commas
            body = "[" + rng.choice([" ", "\n", ""]).join(calls) + "]"
        else:
            body = "\n".join(calls)
    elif kind < 0.5:
        body = json.dumps(random_call(rng, python=False))  # the whole call double-encoded
    elif kind < 0.62:
        body = random_deep(rng)
    elif kind < 0.82:
        body = mutate(random_call(rng, python), rng)
    elif kind < 0.92:
        body = garbage(rng, 40)
    else:
        body = rng.choice(["", " ", "\n", "[]", "{}", "42", '"x"', "null", DEFINITION])
    if rng.random() < 0.1:
        fence = rng.choice(["```json\n", "```\n", "```json "])
        body = fence + body + rng.choice(["\n```", "```", ""])
    return body


def random_block(rng: random.Random) -> str:
    newline = rng.choice(["", "\n"])
    if rng.random() < 0.15:  # Qwen2.5-Coder's <tools> alias
        ending = rng.choice(["</tools>", "</tools>", "</tool_call>", ""])
        return f"<tools>{newline}{random_body(rng)}{newline}{ending}"
    return f"<tool_call>{newline}{random_body(rng)}{newline}{rng.choice(ENDINGS)}"


def random_thought(rng: random.Random) -> str:
    """A thought: prose, maybe calls (never to be run), closed or not; sometimes with no
    opening tag at all (a template that opened it in the prompt)."""
    parts = [
        random_block(rng) if rng.random() < 0.2 else rng.choice(WORDS)
        for _ in range(rng.randint(0, 6))
    ]
    opening = "" if rng.random() < 0.15 else rng.choice(["<think>", "<think>\n"])
    closing = rng.choice(["</think>", "\n</think>\n\n", "</think>", ""])
    return opening + " ".join(parts) + closing


def random_piece(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return random_block(rng)
    if kind < 0.5:
        return random_thought(rng)
    if kind < 0.65:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
    if kind < 0.75:
        pad = " ".join(rng.choice(WORDS + TAG_BITS[:1]) for _ in range(rng.randint(0, 6)))
        return f"<scratch_pad>{pad}" + rng.choice(["</scratch_pad>", "</scratch_pad>", ""])
    if kind < 0.9:
        return garbage(rng)
    return rng.choice(TAG_BITS)


def random_completion(rng: random.Random, *, large: bool = False) -> str:
    """A completion built from structured pieces; ``large`` makes one of 10k to 200k chars."""
    text = "".join(random_piece(rng) for _ in range(rng.randint(0, 6)))
    if not large:
        return text
    target = rng.choice([10_000, 50_000, 200_000])
    shape = rng.random()
    if shape < 0.4:  # many blocks
        pieces = [text]
        while sum(map(len, pieces)) < target:
            pieces.append(random_piece(rng))
        return "".join(pieces)
    if shape < 0.6:  # deep nesting on a large scale
        return (
            text
            + "<tool_call>"
            + rng.choice(list(deep_bodies(target // 2, rng.random() < 0.5).values()))
        )
    if shape < 0.8:  # one long string argument full of tags and quotes
        value = "".join(rng.choice(WORDS + TAG_BITS) for _ in range(target // 6))
        call = json.dumps({"name": "f", "arguments": {"text": value}}, ensure_ascii=False)
        return text + f"<tool_call>{call}" + rng.choice(ENDINGS)
    return text + "<tool_call>" + garbage(rng, target)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.data())
def test_fuzzed_completions_never_raise_and_any_chunking_agrees(
    rng: random.Random, data: Any
) -> None:
    text = random_completion(rng)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=max(1, len(text) // 3)))
    assert_any_chunking_agrees(text, cuts)  # parse_completion runs first: it must not raise


@pytest.mark.parametrize("seed", range(8))
def test_large_fuzzed_completions_token_sized_chunks(seed: int) -> None:
    text = random_completion(random.Random(seed), large=True)
    expected = parse_completion(text, new_id=counter_ids())
    got, _ = stream(split(text, list(range(0, len(text), 4))))
    assert got == expected


def test_generator_covers_what_it_claims() -> None:
    rng = random.Random(0)
    texts = [random_completion(rng) for _ in range(2_000)]
    completions: list[Completion] = [parse_completion(t) for t in texts]
    messages = [e.message for c in completions for e in c.errors]
    assert sum(bool(c.tool_calls) for c in completions) > 500  # many valid calls
    assert any(TOO_DEEP in m for m in messages)
    assert any("a number is too long" in m for m in messages)
    assert any("invalid JSON" in m for m in messages)
    assert any("\ud800" in t for t in texts)
    assert any("{'name'" in t and c.tool_calls for t, c in zip(texts, completions, strict=True))
    # The thinking and Qwen forms (issue 27).
    notes = [n for c in completions for n in c.notes]
    assert sum(c.thought is not None for c in completions) > 200
    assert sum(NOTE_CALL_IN_THOUGHT in n for n in notes) > 50
    assert any(NOTE_REVEALED_THOUGHT in n for n in notes)
    assert any(NOTE_UNCLOSED_THOUGHT in n for n in notes)
    assert sum(call.text_arguments for c in completions for call in c.tool_calls) > 50
    assert any("invalid XML call" in m for m in messages)
    assert any("<tools>" in t and c.tool_calls for t, c in zip(texts, completions, strict=True))
    assert any("tool definition" in m for m in messages)
