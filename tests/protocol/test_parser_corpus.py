"""The held-out parser corpus: other projects' parser test cases, run through this parser.

``tests/protocol/parser_corpus/cases.json`` holds model outputs taken from the current parser test
suites of vLLM, Ollama, llama.cpp and SGLang, written down as facts: the text, what that project
expects (calls, content, reasoning), and where the case comes from (project, file, test,
commit). Only formats this project speaks are taken: Hermes JSON in ``<tool_call>``,
Qwen3-Coder XML, and ``<think>`` thoughts.

Every case runs through ``parse_completion`` and through ``StreamParser`` under many chunkings;
the stream's events must add up to the one-shot parse. A case's ``verdict`` says how this
project's outcome compares with the other project's:

- ``agree``: the same calls (XML values typed by the case's ``tools`` as the ToolSelector types
  them), content and reasoning;
- ``fixed``: the same, since a fix the corpus led to (``fix`` names it);
- ``differs``: a deliberate difference (``difference`` names the reason, which
  docs/protocol.md lists); the test asserts this project's own outcome (``ours``), and that it
  still differs, so a change of behaviour shows up here.

``python tests/protocol/test_parser_corpus.py`` prints the agreement table by source and counts the
stream/one-shot inconsistencies over more chunkings.
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from hermes_agent import typed_arguments
from hermes_agent.protocol import StreamParser, parse_completion
from hermes_agent.protocol.stream_events import StreamEvent
from hermes_agent.types import Completion, ToolCall

try:
    from test_parser import counter_ids
    from test_stream_parser import check_events, split
except ImportError:  # pragma: no cover - tests/ is a package
    from tests.test_parser import counter_ids
    from tests.test_stream_parser import check_events, split

CORPUS: dict[str, Any] = json.loads(
    (Path(__file__).parent / "parser_corpus" / "cases.json").read_text(encoding="utf-8")
)
PROJECTS = ("vLLM", "Ollama", "llama.cpp", "SGLang")
VERDICTS = ("agree", "fixed", "differs")


def _expanded(case: dict[str, Any]) -> dict[str, Any]:
    """The case with its ``repeat`` placeholder (a long run of one character) written out."""
    repeat = case.get("repeat")
    if repeat is None:
        return case
    token, run = repeat["token"], repeat["char"] * repeat["count"]
    return json.loads(json.dumps(case).replace(token, run))


CASES = [_expanded(case) for case in CORPUS["cases"]]
CASE_PARAMS = [pytest.param(case, id=case["id"]) for case in CASES]


def _typed(calls: list[ToolCall], tools: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Calls as ``{"name", "arguments"}``; XML values typed by the tool's schema."""
    out, problems = [], 0
    for call in calls:
        arguments = call.arguments
        if call.text_arguments and call.name in tools:
            arguments, found = typed_arguments(arguments, tools[call.name])
            problems += len(found)
        out.append({"name": call.name, "arguments": arguments})
    return out, problems


def outcome(case: dict[str, Any]) -> dict[str, Any]:
    """This project's outcome for a case, in the corpus's terms."""
    got = parse_completion(case["text"], in_thought=case.get("in_thought", False))
    tools = case.get("tools", {})
    calls, problems = _typed(got.tool_calls, tools)
    thought_calls, thought_problems = _typed(got.thought_calls, tools)
    return {
        "calls": calls,
        "thought_calls": thought_calls,
        "content": got.content,
        "reasoning": got.thought or "",
        "errors": len(got.errors),
        "typing_problems": problems + thought_problems,
    }


def disagreements(case: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Where ``got`` departs from what the other project expects (empty: agreement).

    Content and reasoning are compared stripped (this parser strips them); a call's
    ``arguments`` are compared when the case gives them.
    """
    expected = case["expected"]
    found = []
    if [c["name"] for c in got["calls"]] != [c["name"] for c in expected["calls"]]:
        found.append("calls")
    elif any(
        "arguments" in want and have["arguments"] != want["arguments"]
        for have, want in zip(got["calls"], expected["calls"], strict=True)
    ):
        found.append("arguments")
    if got["typing_problems"]:
        found.append("typing")
    if "content" in expected and got["content"] != expected["content"].strip():
        found.append("content")
    if any(part not in got["content"] for part in expected.get("content_contains", [])):
        found.append("content")
    if "reasoning" in expected and got["reasoning"] != expected["reasoning"].strip():
        found.append("reasoning")
    return found


# --- the corpus itself -------------------------------------------------------------------------


def test_corpus_is_well_formed() -> None:
    ids = [case["id"] for case in CASES]
    assert len(ids) == len(set(ids)), "case ids are unique"
    assert len(CASES) >= 100
    for case in CASES:
        source = case["source"]
        assert source["project"] in PROJECTS, case["id"]
        assert source["path"] and source["test"], case["id"]
        assert len(source["commit"]) == 40 and int(source["commit"], 16) >= 0, case["id"]
        assert case["description"] and case["format"] in ("hermes", "qwen3_coder", "think")
        assert case["verdict"] in VERDICTS, case["id"]
        if case["verdict"] == "differs":
            assert case["difference"] in CORPUS["differences"], case["id"]
        if case["verdict"] == "fixed":
            assert case["fix"] in CORPUS["fixed"], case["id"]
    by_project = Counter(case["source"]["project"] for case in CASES)
    assert all(by_project[project] >= 20 for project in PROJECTS), by_project


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_case_outcome(case: dict[str, Any]) -> None:
    got = outcome(case)
    found = disagreements(case, got)
    if case["verdict"] == "differs":
        assert found, f"{case['id']} agrees now: mark it 'agree' (or 'fixed') in cases.json"
        assert got == case["ours"]
    else:
        assert not found, (found, got)


# --- stream and one-shot parse agree --------------------------------------------------------


def _chunkings(text: str, seed: str, count: int) -> list[list[int]]:
    """Cut positions: one character at a time (for texts up to 5,000 characters), then
    ``count`` random chunkings, reproducible from ``seed``."""
    rng = random.Random(seed)
    cuts = [list(range(len(text)))] if len(text) <= 5000 else []
    for _ in range(count):
        many = rng.randint(1, max(1, min(len(text), 200)))
        cuts.append([rng.randint(0, len(text)) for _ in range(many)])
    return cuts


def stream_inconsistencies(case: dict[str, Any], count: int) -> list[str]:
    """The chunkings under which the stream's result or events differ from the one-shot parse."""
    text, in_thought = case["text"], case.get("in_thought", False)
    expected = parse_completion(text, new_id=counter_ids(), in_thought=in_thought)
    found = []
    for cuts in _chunkings(text, case["id"], count):
        parser = StreamParser(new_id=counter_ids(), in_thought=in_thought)
        events: list[StreamEvent] = []
        for chunk in split(text, cuts):
            events += parser.feed(chunk)
        events += parser.flush()
        got: Completion = parser.close()
        try:
            assert got == expected
            check_events(got, events)
        except AssertionError:
            found.append(f"{case['id']}: cut at {sorted(set(cuts))[:20]}...")
    return found


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_stream_events_add_up_to_the_one_shot_parse(case: dict[str, Any]) -> None:
    assert stream_inconsistencies(case, count=12) == []


# --- the fixes the corpus led to ---------------------------------------------------------------


def test_xml_names_may_hold_blanks() -> None:
    text = (
        "<tool_call><function=get weather>\n<parameter=city name>\nParis\n</parameter>\n"
        "</function></tool_call>"
    )
    (call,) = parse_completion(text).tool_calls
    assert (call.name, call.arguments) == ("get weather", {"city name": "Paris"})
    # A name still ends at its line and never holds a tag.
    broken = parse_completion("<tool_call><function=get\nweather></function></tool_call>")
    assert broken.tool_calls == [] and len(broken.errors) == 1
    broken = parse_completion("<tool_call><function=f\n</function></tool_call>")
    assert broken.tool_calls == [] and len(broken.errors) == 1


@pytest.mark.parametrize("marker", ["</parameter1>", "</parameter_x>", "</parameter"])
def test_a_drifted_close_marker_leaves_an_unclosed_value(marker: str) -> None:
    text = (
        f"<tool_call><function=f><parameter=city>\nShanghai\n{marker}\n"
        "<parameter=days>\n3\n</parameter></function></tool_call>"
    )
    (call,) = parse_completion(text).tool_calls
    assert call.arguments == {"city": "Shanghai", "days": "3"}


def test_a_closed_value_keeps_what_only_looks_like_a_marker() -> None:
    for value in ("x </parameterList>", "<config>\n</parameters>", "a\n</parameter1>"):
        text = f"<tool_call><function=f><parameter=v>{value}</parameter></function></tool_call>"
        (call,) = parse_completion(text).tool_calls
        assert call.arguments == {"v": value}


# --- the table -------------------------------------------------------------------------------


def table(stream_chunkings: int = 12) -> str:
    """Agreement by source, and stream/one-shot inconsistencies, as a Markdown table."""
    rows: dict[str, Counter[str]] = defaultdict(Counter)
    inconsistent = 0
    for case in CASES:
        project = case["source"]["project"]
        got = outcome(case)
        matches = not disagreements(case, got)
        if case["verdict"] == "differs":
            state = "differs" if not matches else "differs, but agrees now"
        else:
            state = case["verdict"] if matches else f"{case['verdict']}, but disagrees now"
        rows[project][state] += 1
        rows[project]["cases"] += 1
        inconsistent += len(stream_inconsistencies(case, stream_chunkings))
    lines = [
        "| source | cases | agree | deliberate difference | bug found, fixed | other |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    total: Counter[str] = Counter()
    for project in PROJECTS:
        row = rows[project]
        total.update(row)
        other = row["cases"] - row["agree"] - row["differs"] - row["fixed"]
        lines.append(
            f"| {project} | {row['cases']} | {row['agree']} | {row['differs']} | {row['fixed']} "
            f"| {other} |"
        )
    other = total["cases"] - total["agree"] - total["differs"] - total["fixed"]
    lines.append(
        f"| all | {total['cases']} | {total['agree']} | {total['differs']} | {total['fixed']} "
        f"| {other} |"
    )
    lines.append("")
    lines.append(
        f"stream vs one-shot inconsistencies: {inconsistent} "
        f"(each case one character at a time and {stream_chunkings} random chunkings)"
    )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - a report, not a test
    print(table(int(sys.argv[1]) if len(sys.argv) > 1 else 50))
