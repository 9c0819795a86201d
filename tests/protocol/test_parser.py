"""parse_completion: every accepted variant, every error, and a round trip of rendered calls.

The table ``CASES`` and the strategy ``completions`` are reused by
tests/protocol/test_stream_parser.py.
"""

from __future__ import annotations

import doctest
import itertools
import json
import string
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_agent.protocol import decoding as decoding_module
from hermes_agent.protocol import parser as parser_module
from hermes_agent.protocol.chatml import render_tool_call
from hermes_agent.protocol.parser import SPECIAL_TOKENS, parse_completion
from hermes_agent.types import Completion, ToolCall

# Parsing model output must never warn (e.g. about escapes in a Python-style literal).
# Warnings the parser itself could raise (escape sequences in literal_eval, deprecations) are
# errors; ResourceWarnings from other tests' sockets collected meanwhile are not ours.
pytestmark = [
    pytest.mark.filterwarnings("error::SyntaxWarning"),
    pytest.mark.filterwarnings("error::DeprecationWarning"),
]

CallSpec = tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], str]

GOOD = '{"name": "get_weather", "arguments": {"city": "Tokyo"}}'
WEATHER = ("get_weather", {"city": "Tokyo"})

# Error kinds: a substring each message must contain.
INVALID = "invalid JSON in <tool_call>"
NO_NAME = 'has no "name"'
BAD_NAME = '"name" must be a non-empty string'
NOT_OBJECT = '"arguments" must be a JSON object'
BAD_STRING = '"arguments" is a string that is not valid JSON'
EMPTY = "empty <tool_call>"
EMPTY_LIST = "empty list"
NOT_CALL = "expected a JSON object"


# Note kinds: a substring each note must contain.
CALL_IN_THOUGHT = "inside the thought was not run"
UNCLOSED_THOUGHT = "ended inside <think>"
REVEALED = "a </think> with no <think> before it"
DEFINITION = "<tools> holds a tool definition"
XML_INVALID = "invalid XML call in <tool_call>"


def case(
    id: str,
    text: str,
    content: str = "",
    calls: list[CallSpec] | tuple[()] = (),
    pad: str | None = None,
    errors: tuple[str, ...] = (),
    thought: str | None = None,
    notes: tuple[str, ...] = (),
) -> Any:
    return pytest.param(text, content, list(calls), pad, errors, thought, notes, id=id)


CASES = [
    # --- plain text ---------------------------------------------------------------------------
    case("empty_text", ""),
    case("plain_text", "The weather is fine.", "The weather is fine."),
    case("text_is_stripped", "  \n Hello.\n\n", "Hello."),
    case("less_than_in_text", "if a < b and b<c: <b>bold</b>", "if a < b and b<c: <b>bold</b>"),
    case("bare_json_is_just_text", GOOD, GOOD),
    # --- tag layout ---------------------------------------------------------------------------
    case("newlines_around_json", f"<tool_call>\n{GOOD}\n</tool_call>", calls=[WEATHER]),
    case("no_newlines", f"<tool_call>{GOOD}</tool_call>", calls=[WEATHER]),
    case(
        "text_before_and_after",
        f"Let me check.\n<tool_call>{GOOD}</tool_call>\nOne moment.",
        "Let me check.\n\nOne moment.",
        [WEATHER],
    ),
    case(
        "two_calls",
        f"<tool_call>\n{GOOD}\n</tool_call>\n"
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "JST"}}\n</tool_call>',
        calls=[WEATHER, ("get_time", {"tz": "JST"})],
    ),
    case(
        "three_calls_back_to_back",
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "c", "arguments": {}}</tool_call>',
        calls=[("a", {}), ("b", {}), ("c", {})],
    ),
    case(
        "missing_close_before_next_open",
        '<tool_call>{"name": "a", "arguments": {}}\n<tool_call>{"name": "b", "arguments": {}}'
        "</tool_call> done",
        "done",
        [("a", {}), ("b", {})],
    ),
    case("unclosed_final_tag", f"Checking.\n<tool_call>\n{GOOD}\n", "Checking.", [WEATHER]),
    case("stray_close_tag_dropped", "Done.</tool_call>", "Done."),
    case(
        "html_like_text_kept",
        "Use <code>x</code> or <tool> or <scratch> here.",
        "Use <code>x</code> or <tool> or <scratch> here.",
    ),
    # --- key order and key names ------------------------------------------------------------
    case(
        "arguments_before_name",
        '<tool_call>{"arguments": {"city": "Tokyo"}, "name": "get_weather"}</tool_call>',
        calls=[WEATHER],
    ),
    case(
        "parameters_instead_of_arguments",
        '<tool_call>{"name": "get_weather", "parameters": {"city": "Tokyo"}}</tool_call>',
        calls=[WEATHER],
    ),
    case(
        "openai_shape_string_arguments",
        '<tool_call>{"type": "function", "function": {"name": "get_weather", '
        '"arguments": "{\\"city\\": \\"Tokyo\\"}"}}</tool_call>',
        calls=[WEATHER],
    ),
    case(
        "openai_shape_with_id",
        '<tool_call>{"id": "call_abc", "type": "function", "function": {"name": "get_weather",'
        ' "arguments": {"city": "Tokyo"}}}</tool_call>',
        calls=[("get_weather", {"city": "Tokyo"}, "call_abc")],
    ),
    case(
        "id_is_kept",
        '<tool_call>{"id": "call_7", "name": "get_weather", "arguments": {"city": "Tokyo"}}'
        "</tool_call>",
        calls=[("get_weather", {"city": "Tokyo"}, "call_7")],
    ),
    case(
        "dotted_name",
        '<tool_call>{"name": "math.factorial", "arguments": {"n": 5}}</tool_call>',
        calls=[("math.factorial", {"n": 5})],
    ),
    case(
        "name_whitespace_stripped",
        '<tool_call>{"name": " get_weather ", "arguments": {"city": "Tokyo"}}</tool_call>',
        calls=[WEATHER],
    ),
    # --- argument shapes --------------------------------------------------------------------
    case("missing_arguments", '<tool_call>{"name": "now"}</tool_call>', calls=[("now", {})]),
    case(
        "null_arguments",
        '<tool_call>{"name": "now", "arguments": null}</tool_call>',
        calls=[("now", {})],
    ),
    case(
        "empty_string_arguments",
        '<tool_call>{"name": "now", "arguments": ""}</tool_call>',
        calls=[("now", {})],
    ),
    case(
        "double_encoded_arguments",
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Tokyo\\"}"}</tool_call>',
        calls=[WEATHER],
    ),
    case(
        "double_encoded_python_arguments",
        '<tool_call>{"name": "get_weather", "arguments": "{\'city\': \'Tokyo\'}"}</tool_call>',
        calls=[WEATHER],
    ),
    case(
        "nested_arguments",
        '<tool_call>{"name": "plot", "arguments": {"series": [[1, 2.5], {"k": [true, null]}]}}'
        "</tool_call>",
        calls=[("plot", {"series": [[1, 2.5], {"k": [True, None]}]})],
    ),
    # --- lenient syntax ---------------------------------------------------------------------
    case(
        "single_quoted_python_dict",
        "<tool_call>{'name': 'get_weather', 'arguments': {'city': 'Tokyo'}}</tool_call>",
        calls=[WEATHER],
    ),
    case(
        "python_literals",
        "<tool_call>{'name': 'f', 'arguments': {'a': True, 'b': False, 'c': None}}</tool_call>",
        calls=[("f", {"a": True, "b": False, "c": None})],
    ),
    case(
        "python_literals_in_double_quotes",
        '<tool_call>{"name": "f", "arguments": {"a": True, "b": None}}</tool_call>',
        calls=[("f", {"a": True, "b": None})],
    ),
    case(
        "mixed_quotes_and_json_literals",
        "<tool_call>{'name': 'f', 'arguments': {'a': true, \"b\": null, 'c': \"it's\"}}"
        "</tool_call>",
        calls=[("f", {"a": True, "b": None, "c": "it's"})],
    ),
    case(
        "python_tuple_becomes_list",
        "<tool_call>{'name': 'f', 'arguments': {'xy': (1, 2)}}</tool_call>",
        calls=[("f", {"xy": [1, 2]})],
    ),
    case(
        "python_string_with_backslash",
        "<tool_call>{'name': 'ls', 'arguments': {'path': 'C:\\data'}}</tool_call>",
        calls=[("ls", {"path": "C:\\data"})],
    ),
    case(
        "trailing_commas",
        '<tool_call>{"name": "f", "arguments": {"a": [1, 2,], "b": "x,}",},}</tool_call>',
        calls=[("f", {"a": [1, 2], "b": "x,}"})],
    ),
    case(
        "code_fence_json",
        f"<tool_call>\n```json\n{GOOD}\n```\n</tool_call>",
        calls=[WEATHER],
    ),
    case("code_fence_bare", f"<tool_call>```\n{GOOD}\n```</tool_call>", calls=[WEATHER]),
    case("code_fence_one_line", f"<tool_call>```json {GOOD} ```</tool_call>", calls=[WEATHER]),
    case(
        "list_of_calls",
        '<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
        "</tool_call>",
        calls=[("a", {"x": 1}), ("b", {})],
    ),
    case(
        "objects_one_after_another",
        '<tool_call>\n{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {}}\n</tool_call>',
        calls=[("a", {}), ("b", {})],
    ),
    case(
        "whole_call_double_encoded",
        '<tool_call>"{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"Tokyo\\"}}"'
        "</tool_call>",
        calls=[WEATHER],
    ),
    # --- tricky string values ---------------------------------------------------------------
    case(
        "close_tag_inside_string",
        '<tool_call>{"name": "echo", "arguments": {"text": "a </tool_call> b"}}</tool_call> ok',
        "ok",
        [("echo", {"text": "a </tool_call> b"})],
    ),
    case(
        "open_tag_and_tokens_inside_string",
        '<tool_call>{"name": "echo", "arguments": {"text": "<tool_call><|im_end|>"}}</tool_call>',
        calls=[("echo", {"text": "<tool_call><|im_end|>"})],
    ),
    case(
        "close_tag_inside_single_quoted_string",
        "<tool_call>{'name': 'echo', 'arguments': {'text': '</tool_call>'}}</tool_call>",
        calls=[("echo", {"text": "</tool_call>"})],
    ),
    case(
        "braces_inside_string",
        '<tool_call>{"name": "fmt", "arguments": {"template": "{x}}{{ {"}}</tool_call>',
        calls=[("fmt", {"template": "{x}}{{ {"})],
    ),
    case(
        "escaped_quotes_and_backslashes",
        '<tool_call>{"name": "sh", "arguments": {"cmd": "echo \\"hi\\" > C:\\\\tmp\\\\"}}'
        "</tool_call>",
        calls=[("sh", {"cmd": 'echo "hi" > C:\\tmp\\'})],
    ),
    case(
        "cjk_text_and_arguments",
        '東京の天気を調べます。<tool_call>{"name": "get_weather", "arguments": {"city": "東京"}}'
        "</tool_call>少々お待ちください。",
        "東京の天気を調べます。少々お待ちください。",
        [("get_weather", {"city": "東京"})],
    ),
    # --- special tokens ---------------------------------------------------------------------
    case("im_end_after_call", f"<tool_call>{GOOD}</tool_call><|im_end|>", calls=[WEATHER]),
    case("im_end_ends_unclosed_block", f"<tool_call>{GOOD}<|im_end|>", calls=[WEATHER]),
    case("endoftext_after_text", "All done.<|endoftext|>", "All done."),
    case("eot_id_after_text", "All done.\n<|eot_id|>", "All done."),
    # --- scratch pad ------------------------------------------------------------------------
    case(
        "scratch_pad_then_call",
        f"<scratch_pad>\nGoal: weather.\nActions: get_weather\n</scratch_pad>\n"
        f"<tool_call>\n{GOOD}\n</tool_call>",
        calls=[WEATHER],
        pad="Goal: weather.\nActions: get_weather",
    ),
    case(
        "scratch_pad_and_text",
        "<scratch_pad>think</scratch_pad>It is sunny.",
        "It is sunny.",
        pad="think",
    ),
    case(
        "tool_call_inside_closed_scratch_pad_is_planning",
        f"<scratch_pad>I will write <tool_call>{GOOD}</tool_call></scratch_pad>Fine.",
        "Fine.",
        pad=f"I will write <tool_call>{GOOD}</tool_call>",
    ),
    case(
        "unclosed_scratch_pad_cut_at_call",
        f"<scratch_pad>Goal: weather\n<tool_call>{GOOD}</tool_call>",
        calls=[WEATHER],
        pad="Goal: weather",
    ),
    case("unclosed_scratch_pad_at_end", "<scratch_pad>thinking<|im_end|>", pad="thinking"),
    # --- errors -----------------------------------------------------------------------------
    case(
        "invalid_json",
        '<tool_call>{"name": "f", "arguments": {"a": 1 "b": 2}}</tool_call>',
        errors=(INVALID,),
    ),
    case("missing_name", '<tool_call>{"arguments": {"a": 1}}</tool_call>', errors=(NO_NAME,)),
    case(
        "openai_shape_missing_name",
        '<tool_call>{"type": "function", "function": {"arguments": {}}}</tool_call>',
        errors=(NO_NAME,),
    ),
    case("name_not_a_string", '<tool_call>{"name": 42}</tool_call>', errors=(BAD_NAME,)),
    case("name_empty", '<tool_call>{"name": " "}</tool_call>', errors=(BAD_NAME,)),
    case(
        "arguments_list",
        '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>',
        errors=(NOT_OBJECT,),
    ),
    case(
        "arguments_number",
        '<tool_call>{"name": "f", "arguments": 3}</tool_call>',
        errors=(NOT_OBJECT,),
    ),
    case(
        "arguments_string_not_json",
        '<tool_call>{"name": "f", "arguments": "Tokyo"}</tool_call>',
        errors=(BAD_STRING,),
    ),
    case(
        "arguments_string_encoding_a_list",
        '<tool_call>{"name": "f", "arguments": "[1, 2]"}</tool_call>',
        errors=(NOT_OBJECT,),
    ),
    case("empty_tag", "Hmm.<tool_call></tool_call>", "Hmm.", errors=(EMPTY,)),
    case("whitespace_tag", "<tool_call>\n  \n</tool_call>", errors=(EMPTY,)),
    case("empty_list", "<tool_call>[]</tool_call>", errors=(EMPTY_LIST,)),
    case("not_an_object", "<tool_call>42</tool_call>", errors=(NOT_CALL,)),
    case(
        "list_with_one_bad_item",
        '<tool_call>[{"name": "a"}, "b", {"arguments": {}}]</tool_call>',
        calls=[("a", {})],
        errors=(NOT_CALL, NO_NAME),
    ),
    case(
        "unclosed_tag_with_garbage",
        "Sure thing.\n<tool_call>I don't know which tool",
        "Sure thing.",
        errors=(INVALID,),
    ),
    case(
        "apostrophe_in_garbage_block",
        "<tool_call>I don't know</tool_call> ok",
        "ok",
        errors=(INVALID,),
    ),
    case(
        "escaped_quotes_outside_strings",
        '<tool_call>\\"\\"\\"</tool_call> after',
        "after",
        errors=(INVALID,),
    ),
    case(
        "truncated_json",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Tok',
        errors=(INVALID,),
    ),
    case(
        "one_bad_block_among_two_good",
        f"<tool_call>{GOOD}</tool_call>\n<tool_call>{{name: oops</tool_call>\n"
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
        calls=[WEATHER, ("get_time", {})],
        errors=(INVALID,),
    ),
    case(
        "unterminated_string_recovered",
        '<tool_call>{"name": "a", "arguments": {"q": "abc}</tool_call> and then '
        '<tool_call>{"name": "b", "arguments": {}}</tool_call> end',
        "and then  end",
        [("b", {})],
        errors=(INVALID,),
    ),
    case(
        "every_error_kind_kept_in_order",
        "<tool_call>[</tool_call><tool_call>{}</tool_call>"
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        errors=(INVALID, NO_NAME, NOT_OBJECT),
    ),
    # --- thoughts (<think>): kept apart, never a source of calls -----------------------------
    case(
        "think_then_answer",
        "<think>\nThe user wants the weather.\n</think>\n\nIt is sunny.",
        "It is sunny.",
        thought="The user wants the weather.",
    ),
    case(
        "think_then_call",
        f"<think>I need get_weather.</think>\n<tool_call>\n{GOOD}\n</tool_call>",
        calls=[WEATHER],
        thought="I need get_weather.",
    ),
    case(
        "call_inside_think_is_never_a_call",
        '<think>Maybe <tool_call>{"name": "rm", "arguments": {}}</tool_call>? No.</think>Answer.',
        "Answer.",
        thought='Maybe <tool_call>{"name": "rm", "arguments": {}}</tool_call>? No.',
        notes=(CALL_IN_THOUGHT,),
    ),
    case(
        "tools_tag_inside_think_is_never_a_call",
        '<think>or <tools>{"name": "rm"}</tools></think>No.',
        "No.",
        thought='or <tools>{"name": "rm"}</tools>',
        notes=(CALL_IN_THOUGHT,),
    ),
    case(
        "unclosed_think_swallows_its_call",
        f"<think>I could <tool_call>{GOOD}</tool_call><|im_end|>",
        thought=f"I could <tool_call>{GOOD}</tool_call>",
        notes=(UNCLOSED_THOUGHT, CALL_IN_THOUGHT),
    ),
    case("empty_think_is_no_thought", "<think>\n\n</think>\n\nHi.", "Hi."),
    case(
        "think_tag_repeated_inside_think",
        "<think>\n<think>plan</think>Done.",
        "Done.",
        thought="plan",
    ),
    case(
        "bare_close_think_makes_a_thought_of_what_came_before",
        "The user asks for rain.\n</think>\n\nNo rain today.",
        "No rain today.",
        thought="The user asks for rain.",
        notes=(REVEALED,),
    ),
    case(
        "bare_close_think_voids_the_calls_before_it",
        f"Maybe <tool_call>{GOOD}</tool_call>? No.</think>Answer.",
        "Answer.",
        thought=f"Maybe <tool_call>{GOOD}</tool_call>? No.",
        notes=(REVEALED, CALL_IN_THOUGHT),
    ),
    case(
        "bare_close_think_then_a_real_call",
        f"plan</think><tool_call>{GOOD}</tool_call>",
        calls=[WEATHER],
        thought="plan",
        notes=(REVEALED,),
    ),
    case(
        "second_close_think_is_stray",
        "<think>a</think>b</think>c",
        "bc",
        thought="a",
    ),
    case(
        "think_ends_an_unclosed_block",
        f"<tool_call>{GOOD}<think>more</think>Then text.",
        "Then text.",
        [WEATHER],
        thought="more",
    ),
    case(
        "bare_close_think_ends_an_unclosed_block_and_voids_it",
        f"<tool_call>{GOOD}</think>Then text.",
        "Then text.",
        thought=f"<tool_call>{GOOD}",
        notes=(REVEALED, CALL_IN_THOUGHT),
    ),
    case(
        "two_thoughts_interleaved_with_calls",
        f"<think>first</think><tool_call>{GOOD}</tool_call><think>second</think>Done.",
        "Done.",
        [WEATHER],
        thought="first\nsecond",
    ),
    case(
        "think_inside_a_string_is_an_argument",
        '<tool_call>{"name": "echo", "arguments": {"t": "<think>x</think>"}}</tool_call>',
        calls=[("echo", {"t": "<think>x</think>"})],
    ),
    # --- Qwen3-Coder XML calls ----------------------------------------------------------------
    case(
        "xml_call",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nTokyo\n</parameter>\n"
        "</function>\n</tool_call>",
        calls=[WEATHER],
    ),
    case(
        "xml_call_values_stay_text",
        '<tool_call><function=f><parameter=n>3</parameter><parameter=o>{"a": 1}</parameter>'
        "</function></tool_call>",
        calls=[("f", {"n": "3", "o": '{"a": 1}'})],
    ),
    case(
        "xml_call_keeps_inner_blanks",
        "<tool_call>\n<function=write>\n<parameter=code>\n  x = 1\n\n</parameter>\n"
        "</function>\n</tool_call>",
        calls=[("write", {"code": "  x = 1\n"})],
    ),
    case(
        "xml_call_without_parameters",
        "<tool_call><function=now></function></tool_call>",
        calls=[("now", {})],
    ),
    case(
        "xml_call_missing_closing_tags",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</tool_call> ok",
        "ok",
        [("f", {"a": "1", "b": "2"})],
    ),
    case(
        "xml_two_functions_in_one_block",
        "<tool_call><function=a><parameter=x>1</parameter></function>\n"
        "<function=b></function></tool_call>",
        calls=[("a", {"x": "1"}), ("b", {})],
    ),
    case(
        "xml_values_are_raw_text_with_any_quotes",
        "<tool_call><function=note><parameter=q>it's \"open, 'x: {\"a</parameter>"
        "</function></tool_call> ok",
        "ok",
        [("note", {"q": "it's \"open, 'x: {\"a"})],
    ),
    case(
        # Like every Qwen3-Coder parser: a raw value cannot hold the closing tag.
        "xml_value_cannot_hold_the_closing_tag",
        '<tool_call><function=echo><parameter=o>{"t": "</tool_call>"}</parameter></function>',
        '"}</parameter></function>',
        [("echo", {"o": '{"t": "'})],
    ),
    case(
        "xml_call_stray_text_is_an_error",
        "<tool_call><function=f><parameter=a>1</parameter>oops</function></tool_call>",
        errors=(XML_INVALID,),
    ),
    case(
        "xml_call_without_a_name",
        "<tool_call><function=>\n</function></tool_call>",
        errors=(XML_INVALID,),
    ),
    case(
        "xml_duplicate_parameter",
        "<tool_call><function=f><parameter=a>1</parameter><parameter=a>2</parameter></function>"
        "</tool_call>",
        errors=("given twice",),
    ),
    case(
        "xml_call_after_think",
        "<think>call it</think>\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
        "Tokyo\n</parameter>\n</function>\n</tool_call>",
        calls=[WEATHER],
        thought="call it",
    ),
    # --- <tools> as an alias of <tool_call> ---------------------------------------------------
    case("tools_tag_is_a_call", f"<tools>\n{GOOD}\n</tools>", calls=[WEATHER]),
    case(
        "tools_tag_with_text_around",
        f"Checking.<tools>{GOOD}</tools> Done.",
        "Checking. Done.",
        [WEATHER],
    ),
    case("tools_tag_unclosed", f"<tools>{GOOD}", calls=[WEATHER]),
    case("tools_tag_mixed_closer", f"<tools>{GOOD}</tool_call>x", "x", [WEATHER]),
    case(
        "tools_tag_echoing_a_definition_is_an_error",
        '<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "d", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}\n</tools>',
        errors=(DEFINITION,),
    ),
    case(
        "tools_tag_bad_json_is_an_error",
        "<tools>not a call</tools>",
        errors=(INVALID,),
    ),
    case("stray_close_tools_dropped", "Done.</tools>", "Done."),
    # --- missing commas ------------------------------------------------------------------------
    case(
        "list_missing_commas",
        '<tool_call>[{"name": "a", "arguments": {"x": 1}} {"name": "b", "arguments": {}}\n'
        '{"name": "c"}]</tool_call>',
        calls=[("a", {"x": 1}), ("b", {}), ("c", {})],
    ),
    case(
        "python_list_missing_commas",
        "<tool_call>[{'name': 'a', 'arguments': {}} {'name': 'b', 'arguments': {'s': '} {'}}]"
        "</tool_call>",
        calls=[("a", {}), ("b", {"s": "} {"})],
    ),
]


def counter_ids() -> Callable[[], str]:
    """A ``new_id`` that numbers calls, so equal inputs give equal completions."""
    numbers = itertools.count()
    return lambda: f"gen_{next(numbers)}"


def check(
    got: Completion,
    content: str,
    calls: list[CallSpec],
    pad: str | None,
    errors: tuple[str, ...],
    thought: str | None = None,
    notes: tuple[str, ...] = (),
) -> None:
    assert got.content == content
    assert [(c.name, c.arguments) for c in got.tool_calls] == [spec[:2] for spec in calls]
    for call, spec in zip(got.tool_calls, calls, strict=True):
        if len(spec) == 3:
            assert call.id == spec[2]
        else:
            assert call.id.startswith("call_")
    assert got.scratch_pad == pad
    assert len(got.errors) == len(errors), got.errors
    for error, kind in zip(got.errors, errors, strict=True):
        assert kind in error.message
    assert got.thought == thought
    assert len(got.notes) == len(notes), got.notes
    for note, kind in zip(got.notes, notes, strict=True):
        assert kind in note


@pytest.mark.parametrize(("text", "content", "calls", "pad", "errors", "thought", "notes"), CASES)
def test_parse_completion(
    text: str,
    content: str,
    calls: list[CallSpec],
    pad: str | None,
    errors: tuple[str, ...],
    thought: str | None,
    notes: tuple[str, ...],
) -> None:
    check(parse_completion(text), content, calls, pad, errors, thought, notes)


@pytest.mark.parametrize("module", [parser_module, decoding_module])
def test_module_docstring_example_runs(module: ModuleType) -> None:
    outcome = doctest.testmod(module)
    assert outcome.attempted > 0
    assert outcome.failed == 0


def test_old_import_path_names_the_decoding_helpers() -> None:
    # The scanner re-exports what it used to define itself; both names are one object.
    assert parser_module.MAX_NESTING is decoding_module.MAX_NESTING
    assert parser_module.SPECIAL_TOKENS is decoding_module.SPECIAL_TOKENS
    assert parser_module.decode_value is decoding_module.decode_value


def test_case_table_is_large_enough() -> None:
    assert len(CASES) >= 45


def test_invalid_json_message_names_the_problem_and_the_fix() -> None:
    (error,) = parse_completion(
        '<tool_call>{"name": "f", "arguments": {"a": 1 "b": 2}}</tool_call>'
    ).errors
    assert error.block == '{"name": "f", "arguments": {"a": 1 "b": 2}}'
    assert error.message == (
        "invalid JSON in <tool_call>: Expecting ',' delimiter at char 35; "
        'write {"name": ..., "arguments": {...}}'
    )


def test_error_block_is_the_raw_text_between_the_tags() -> None:
    (error,) = parse_completion("<tool_call>\n{oops}\n</tool_call>").errors
    assert error.block == "\n{oops}\n"


def test_generated_ids_come_from_new_id() -> None:
    completion = parse_completion(
        '<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b", "id": "x"}</tool_call>'
        '<tool_call>{"name": "c"}</tool_call>',
        new_id=counter_ids(),
    )
    assert [c.id for c in completion.tool_calls] == ["gen_0", "x", "gen_1"]


def test_default_ids_are_unique() -> None:
    completion = parse_completion(f"<tool_call>{GOOD}</tool_call>" * 3)
    assert len({c.id for c in completion.tool_calls}) == 3


# --- round trip of rendered calls ------------------------------------------------------------

TAGS = (
    "<tool_call>", "</tool_call>", "<tools>", "</tools>", "<scratch_pad>", "</scratch_pad>",
    "<think>", "</think>", *SPECIAL_TOKENS,
)  # fmt: skip

names = st.from_regex(
    r"[A-Za-z_][A-Za-z0-9_]{0,12}(\.[A-Za-z_][A-Za-z0-9_]{0,8}){0,2}", fullmatch=True
)
tricky_text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        ["</tool_call>", "<tool_call>", "{", "}", '"', "'", "\\", "東京", "<|im_end|>", "</s>"]
    ),
    st.lists(st.sampled_from(['{"', "}", "</tool_call>", "'", '\\"', "天気", " "])).map("".join),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | tricky_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(tricky_text, children, max_size=4)
    ),
    max_leaves=12,
)
arguments = st.dictionaries(tricky_text, json_values, max_size=5)
# Free text may hold "<", braces and quotes, but no complete tag (that would make it not text).
free_text = st.text(
    alphabet=st.sampled_from([*string.ascii_letters, *" \n.,:;!?{}[]\"'<>/|_", "東", "京"]),
    max_size=30,
).filter(lambda t: not any(tag in t for tag in TAGS))
pad_text = st.text(max_size=30).filter(lambda t: "</scratch_pad>" not in t)


@st.composite
def completions(draw: st.DrawFn) -> tuple[str, Completion]:
    """A completion rendered the way the protocol renders it, and what it must parse to."""
    pieces: list[tuple[bool, str]] = []  # (is free text, piece)
    pad = draw(st.none() | pad_text)
    if pad is not None:
        pieces.append((False, f"<scratch_pad>\n{pad}\n</scratch_pad>"))
    calls: list[ToolCall] = []
    for _ in range(draw(st.integers(0, 3))):
        pieces.append((True, draw(free_text)))
        calls.append(ToolCall(name=draw(names), arguments=draw(arguments)))
        pieces.append((False, render_tool_call(calls[-1])))
    pieces.append((True, draw(free_text)))
    separator = draw(st.sampled_from(["\n", "", " "]))
    text = separator.join(piece for _, piece in pieces)
    # The separators are free text too; only the tagged pieces drop out of the content.
    content = separator.join(piece if is_text else "" for is_text, piece in pieces).strip()
    scratch_pad = None if pad is None else pad.strip()
    return text, Completion(content=content, tool_calls=calls, scratch_pad=scratch_pad)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(completions())
def test_rendered_calls_round_trip(sample: tuple[str, Completion]) -> None:
    text, expected = sample
    got = parse_completion(text)
    assert got.errors == []
    assert got.content == expected.content
    assert got.scratch_pad == expected.scratch_pad
    assert [(c.name, c.arguments) for c in got.tool_calls] == [
        (c.name, c.arguments) for c in expected.tool_calls
    ]


# Tag fragments, JSON pieces and quotes thrown together: mostly broken, always parseable.
soup = st.lists(
    st.sampled_from(
        [
            *TAGS,
            "<tool_",
            "</scratch",
            "<|im",
            "<",
            '"',
            "'",
            "\\",
            "{",
            "}",
            "[",
            "]",
            ":",
            ",",
            '{"name": "f", "arguments": {"a": "</tool_call>"}}',
            "{'name': 'g', 'arguments': {'b': None,},}",
            "```json\n",
            "```",
            " text ",
            "\n",
            "東京",
        ]
    )
    | st.text(max_size=4),
    max_size=30,
).map("".join)


@settings(max_examples=300)
@given(st.text(max_size=200) | soup)
def test_never_raises(text: str) -> None:
    completion = parse_completion(text)
    for call in completion.tool_calls:
        assert isinstance(call.arguments, dict)
        json.dumps(call.arguments)
