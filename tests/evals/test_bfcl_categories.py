"""The BFCL categories beyond the first eight: Java and JavaScript through BFCL's own type
converters, relevance, and the multi-turn variants (held-out functions, missing parameters,
long context), each as BFCL defines it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest

from hermes_agent import ScriptedModel
from hermes_agent.evals import bfcl_compat, bfcl_install
from hermes_agent.evals.bfcl import (
    ADDED_FUNCTIONS_PROMPT,
    CATEGORIES,
    BfclHarness,
    load_cases,
    oracle_model_for,
    parse_categories,
    shared_model,
)
from hermes_agent.evals.bfcl_languages import JAVA, JAVASCRIPT, prompt_functions, source_value
from hermes_agent.types import Message

needs_bfcl = pytest.mark.skipif(not bfcl_compat.available(), reason=bfcl_install.missing_message())


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_all_means_every_offline_category() -> None:
    assert parse_categories("all") == list(CATEGORIES)
    assert set(CATEGORIES) == {
        "simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
        "parallel_multiple", "irrelevance", "live_simple", "live_multiple", "live_parallel",
        "live_parallel_multiple", "live_irrelevance", "live_relevance", "multi_turn_base",
        "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context",
    }  # fmt: skip


# -- Java and JavaScript --------------------------------------------------------------------


def test_java_and_javascript_docs_are_prompted_as_strings_with_their_type_in_words() -> None:
    doc = {
        "name": "Foo.bar",
        "description": "Does foo.",
        "parameters": {
            "type": "dict",
            "properties": {
                "ids": {"type": "ArrayList", "description": "Ids.", "items": {"type": "long"}},
                "flag": {"type": "boolean", "description": "A flag."},
                "thing": {"type": "any", "description": "Anything."},
            },
            "required": ["ids"],
        },
    }
    (java,) = prompt_functions([doc], JAVA)
    assert (
        java["description"] == "Does foo. Note that the provided function is in Java 8 SDK syntax."
    )
    ids = java["parameters"]["properties"]["ids"]
    assert ids == {
        "type": "string",
        "description": "Ids. This is Java ArrayList type parameter in string representation. "
        "The list elements are of type long; they are not in string representation.",
    }
    assert java["parameters"]["properties"]["thing"]["description"].endswith(
        "any type of Java object in string representation."
    )
    assert doc["parameters"]["properties"]["ids"]["type"] == "ArrayList"  # input untouched

    js_doc = {
        "name": "f",
        "description": "F.",
        "parameters": {
            "type": "dict",
            "properties": {
                "opts": {
                    "type": "dict",
                    "description": "O.",
                    "properties": {"a": {"type": "String"}},
                }
            },
        },
    }
    (js,) = prompt_functions([js_doc], JAVASCRIPT)
    opts = js["parameters"]["properties"]["opts"]
    assert opts["type"] == "string" and "properties" not in opts
    assert opts["description"].endswith(
        'they are not in string representation. {"a": {"type": "String"}}'
    )


@needs_bfcl
@pytest.mark.parametrize(
    ("language", "value", "spec", "written"),
    [
        (JAVA, True, {"type": "boolean"}, "true"),
        (JAVA, 7, {"type": "long"}, "7L"),
        (JAVA, 1.5, {"type": "float"}, "1.5f"),
        (JAVA, ["a", "b"], {"type": "Array", "items": {"type": "String"}}, "new String[]{a, b}"),
        (
            JAVA,
            ["a", "b"],
            {"type": "ArrayList", "items": {"type": "String"}},
            'new ArrayList<String>(Arrays.asList("a", "b"))',
        ),
        (
            JAVA,
            {"limit": 50, "on": True},
            {"type": "HashMap"},
            'new HashMap<String, Object>() {{ put("limit", 50); put("on", true); }}',
        ),
        (JAVASCRIPT, 12, {"type": "Bigint"}, "12n"),
        (JAVASCRIPT, [1, 2], {"type": "array", "items": {"type": "integer"}}, "[1, 2]"),
        (JAVASCRIPT, {"a": "x", "n": 2}, {"type": "dict"}, '{a: "x", n: 2}'),
        (JAVASCRIPT, "plain", {"type": "String"}, "plain"),
    ],
)
def test_the_oracle_writes_source_text_that_bfcl_reads_back(
    language: str, value: Any, spec: dict[str, Any], written: str
) -> None:
    convert = bfcl_compat.type_converter(language)
    text = source_value(value, spec, language, convert)
    assert text == written
    item = spec.get("items", {}).get("type")
    assert (convert(text, spec["type"], item) if item else convert(text, spec["type"])) == value


@needs_bfcl
def test_java_arguments_are_strings_checked_through_bfcls_converter() -> None:
    (case,) = load_cases("simple_java", 2)[1:]  # SQLCompletionAnalyzer.makeProposalsFromObject
    properties = case.functions[0]["parameters"]["properties"]
    assert {spec["type"] for spec in properties.values()} == {"string"}
    assert case.checker_functions[0]["parameters"]["properties"]["useShortName"]["type"] == (
        "boolean"
    )
    name = case.functions[0]["name"]
    hashmap = 'new HashMap<String, String>() {{ put("limit", 50); put("schemaFilter", "public"); }}'
    right = {"object": "Customers", "useShortName": "true", "params": hashmap}
    harness = BfclHarness(shared_model(ScriptedModel([_call(name, right)])))
    assert harness.run_case(case).correct
    # "True" is not Java: BFCL's converter leaves it a string, and the checker says so.
    wrong = BfclHarness(
        shared_model(ScriptedModel([_call(name, {**right, "useShortName": "True"})]))
    )
    result = wrong.run_case(case)
    assert not result.correct and "useShortName" in (result.error or "")
    # A JSON boolean is not a string: the pipeline refuses it before any checker sees it.
    typed = BfclHarness(shared_model(ScriptedModel([_call(name, {**right, "useShortName": True})])))
    result = typed.run_case(case)
    assert not result.correct and result.invalid


# -- relevance ------------------------------------------------------------------------------


@needs_bfcl
def test_live_relevance_is_correct_with_any_call_and_wrong_without_one() -> None:
    (case,) = load_cases("live_relevance", 1)
    name = case.functions[0]["name"]
    prose = BfclHarness(shared_model(ScriptedModel(["Here is a painting idea."]))).run_case(case)
    assert not prose.correct and prose.error == "no function call where one was expected"
    # Any call BFCL can decode counts, even one our validator refuses (here: no arguments).
    refused = BfclHarness(shared_model(ScriptedModel([_call(name, {})]))).run_case(case)
    assert refused.correct and refused.invalid

    (irrelevant,) = load_cases("live_irrelevance", 1)
    called = ScriptedModel([_call(irrelevant.functions[0]["name"], {"url": "https://x"})])
    result = BfclHarness(shared_model(called)).run_case(irrelevant)
    assert not result.correct and result.error == "the model called a function where none fits"


# -- multi-turn variants --------------------------------------------------------------------


class _Recorder:
    """A model that records the tools and the last user message of every turn it is asked."""

    def __init__(self) -> None:
        self.seen: list[tuple[list[str], str]] = []

    def __call__(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
        names = [tool["function"]["name"] for tool in tools]
        last_user = next(m.content for m in reversed(messages) if m.role == "user")
        self.seen.append((names, str(last_user)))
        return "I cannot do that."


@needs_bfcl
def test_miss_func_holds_functions_back_until_their_turn() -> None:
    (case,) = load_cases("multi_turn_miss_func", 1)  # sort is held out until turn 3
    assert {turn: [doc["name"] for doc in docs] for turn, docs in case.held_out.items()} == {
        3: ["sort"]
    }
    assert case.turns[3] == []
    recorder = _Recorder()
    BfclHarness(shared_model(ScriptedModel(recorder))).run_case(case)
    assert len(recorder.seen) == len(case.turns)
    for turn, (tools, question) in enumerate(recorder.seen):
        assert ("sort" in tools) == (turn >= 3), turn
        assert (question == ADDED_FUNCTIONS_PROMPT) == (turn == 3)
    # As BFCL does, the held-out doc arrives without the language hint the first prompt got.
    assert "Python 3 syntax" not in case.held_out[3][0]["description"]
    assert all("Python 3 syntax" in doc["description"] for doc in case.functions)


@needs_bfcl
def test_miss_param_turns_without_ground_truth_need_no_call() -> None:
    (case,) = load_cases("multi_turn_miss_param", 1)
    empty = [turn for turn, calls in enumerate(case.ground_truth) if not calls]
    assert empty  # the turn where a parameter is missing: the model should ask, not call
    result = BfclHarness(oracle_model_for).run_case(case)
    assert result.correct
    # The oracle answers those turns in text: one completion, and no call, for each of them.
    assert result.completions.count("None of the available functions can answer this request.") == (
        len(empty)
    )


@needs_bfcl
def test_long_context_backends_are_loaded_with_their_long_context_data() -> None:
    (case,) = load_cases("multi_turn_long_context", 1)
    assert case.long_context and "GorillaFileSystem" in case.involved_classes

    def first_listing(variant: Any) -> str:
        seen: list[str] = []

        def answer(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
            if messages[-1].role == "tool":
                seen.append(json.dumps(messages[-1].tool_results[-1].content))
                return "Done."
            # archive/ is empty in the scenario: a bottom folder, which long context fills.
            return "Done." if seen else _call("cd", {"folder": "archive"}) + _call("ls", {})

        BfclHarness(shared_model(ScriptedModel(answer))).run_case(variant)
        return seen[0]

    long_listing = first_listing(case)
    base_listing = first_listing(dataclasses.replace(case, category="multi_turn_base"))
    assert len(long_listing) > len(base_listing)  # extra files appear only with long context
