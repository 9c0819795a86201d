"""The BFCL harness: data, schema conversion, BFCL's checkers, the oracle and the CLI."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("bfcl_eval", reason="pip install --no-deps bfcl-eval==2026.3.23 mpmath")

from hermes_agent import ScriptedModel
from hermes_agent.cli import app
from hermes_agent.evals import bfcl_compat
from hermes_agent.evals.bfcl import (
    CATEGORIES,
    BfclHarness,
    convert_parameters,
    load_cases,
    oracle_model_for,
    shared_model,
    to_tool,
)
from hermes_agent.evals.oracle import parse_call_string

runner = CliRunner()


@pytest.mark.parametrize("category", CATEGORIES)
def test_oracle_scores_100_percent_on_the_first_20_cases(category: str) -> None:
    report = BfclHarness(oracle_model_for).run(load_cases(category, 20))
    assert report.total == 20
    assert [(r.id, r.error) for r in report.failures()] == []
    for result in report.results:
        assert result.completions and not result.malformed and not result.invalid


def test_bfcl_types_convert_to_json_schema() -> None:
    schema = convert_parameters(
        {
            "type": "dict",
            "properties": {
                "x": {"type": "float", "description": "a number"},
                "pair": {"type": "tuple", "items": {"type": "integer"}},
                "options": {"type": "dict", "properties": {"k": {"type": "string"}}},
                "anything": {"type": "any", "optional": True},
                "tags": {"type": "array", "items": {"type": "string"}, "enum": ["a", "b"]},
            },
            "required": ["x"],
        }
    )
    assert schema == {
        "type": "object",
        "properties": {
            "x": {"type": "number", "description": "a number"},
            "pair": {"type": "array", "items": {"type": "integer"}},
            "options": {"type": "object", "properties": {"k": {"type": "string"}}},
            "anything": {},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
        },
        "required": ["x"],
        "additionalProperties": False,
    }
    tool = to_tool(
        {
            "name": "math.factorial",
            "description": "n!",
            "parameters": {"type": "dict", "properties": {}},
        }
    )
    assert tool.name == "math.factorial"  # dotted names are kept


def test_ast_checker_is_imported_without_vendor_sdks() -> None:
    checker = bfcl_compat.ast_checker()
    assert callable(checker)
    assert "bfcl_eval.constants.model_config" not in sys.modules  # the stand-in is gone again
    assert "bfcl_eval.model_handler.api_inference.claude" not in sys.modules


def test_wrong_answers_are_scored_wrong() -> None:
    (case,) = load_cases("simple_python", 1)  # triangle area, base 10 height 5
    call = '{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 6}}'
    wrong = ScriptedModel([f"<tool_call>{call}</tool_call>"])
    result = BfclHarness(shared_model(wrong)).run_case(case)
    assert not result.correct
    assert "Invalid value for parameter 'height'" in (result.error or "")
    assert result.calls == [
        {"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 6}}
    ]

    (irrelevant,) = load_cases("irrelevance", 1)
    name = irrelevant.functions[0]["name"]
    caller = ScriptedModel([f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>'])
    result = BfclHarness(shared_model(caller)).run_case(irrelevant)
    assert not result.correct and result.invalid  # a call, though refused, where none fits
    prose = BfclHarness(shared_model(ScriptedModel(["I can't."]))).run_case(irrelevant)
    assert prose.correct and not prose.made_call


def test_multi_turn_runs_on_fresh_backends_and_forgets_checker_state() -> None:
    (case,) = load_cases("multi_turn_base", 1)
    harness = BfclHarness(oracle_model_for)
    first, second = harness.run_case(case), harness.run_case(case)
    assert first.correct and second.correct  # the second run starts from the same scenario
    assert first.calls == second.calls
    assert len(first.completions) == 2 * len(case.turns)  # calls, then an answer, per turn
    assert bfcl_compat.forget_checker_instances(harness.run_key) == 0  # already dropped

    stuck = BfclHarness(shared_model(ScriptedModel(lambda m, t: "I will not.")))
    result = stuck.run_case(case)
    assert not result.correct and "empty" in (result.error or "")


def test_ground_truth_call_strings_name_positional_arguments() -> None:
    call = parse_call_string("sort('a.pdf', reverse=True)", {"sort": ["file_name", "reverse"]})
    assert (call.name, call.arguments) == ("sort", {"file_name": "a.pdf", "reverse": True})
    assert parse_call_string("f(x=(1, 2))", {}).arguments == {"x": [1, 2]}


def test_cli_oracle_run_writes_a_report(tmp_path: Path) -> None:
    out = tmp_path / "bfcl.json"
    done = runner.invoke(
        app,
        [
            "eval",
            "bfcl",
            "--category",
            "parallel,multi_turn_base",
            "--limit",
            "2",
            "--min-accuracy",
            "1",
            "-r",
            str(out),
            "-q",
        ],
    )
    assert done.exit_code == 0, done.output
    report = json.loads(out.read_text())
    assert report["summary"]["accuracy"] == 1.0
    assert [c["category"] for c in report["summary"]["categories"]] == [
        "parallel",
        "multi_turn_base",
    ]
    assert report["cases"][0]["completions"][0].startswith("<tool_call>")
    assert report["cases"][0]["verdict"] == {"valid": True, "error": []}

    bad = runner.invoke(app, ["eval", "bfcl", "--category", "simple_java"])
    assert bad.exit_code == 2 and "unknown BFCL category simple_java" in bad.output


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python")
@pytest.mark.parametrize("grammar", ["--grammar", "--no-grammar"])
def test_embedded_model_runs_through_the_harness(tmp_path: Path, grammar: str) -> None:
    out = tmp_path / "embedded.json"
    done = runner.invoke(
        app,
        [
            "eval",
            "bfcl",
            "--category",
            "simple_python",
            "--limit",
            "5",
            "--model",
            "embedded",
            grammar,
            "-r",
            str(out),
            "-q",
        ],
    )
    assert done.exit_code == 0, done.output
    report = json.loads(out.read_text())
    assert report["settings"]["grammar"] is (grammar == "--grammar")
    assert report["summary"]["total"] == 5
    for case in report["cases"]:
        assert len(case["completions"]) == 1 and case["duration_s"] > 0
        assert case["correct"] == case["verdict"].get("valid", False)
        if not case["correct"]:
            assert case["error"]
    (summary,) = report["summary"]["categories"]
    assert summary["correct"] == sum(case["correct"] for case in report["cases"])
    assert summary["malformed"] == sum(case["malformed"] for case in report["cases"])
