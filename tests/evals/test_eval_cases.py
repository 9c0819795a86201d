"""User regression suites: the YAML format, the matching rules and `hermes-agent eval`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hermes_agent import ScriptedModel
from hermes_agent.cli import app
from hermes_agent.errors import ConfigError
from hermes_agent.evals import load_suite, run_suite
from hermes_agent.evals.cases import ExpectedCall, calls_mismatch, values_equal

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
runner = CliRunner()


def test_example_suite_passes_and_fails_as_built(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    done = runner.invoke(app, ["eval", str(EXAMPLES / "eval_cases.yaml"), "-r", str(report_path)])
    assert done.exit_code == 1, done.output  # the case built to fail fails the suite
    report = json.loads(report_path.read_text())
    verdicts = {case["id"]: case["correct"] for case in report["cases"]}
    assert verdicts == {
        "weather-paris": True,
        "currency": True,
        "small-talk": True,
        "oslo-executed": True,
        "tokyo-built-to-fail": False,
    }
    failed = next(c for c in report["cases"] if c["id"] == "tokyo-built-to-fail")
    assert "'Kyoto', expected one of ['Tokyo']" in failed["error"]
    assert failed["completions"][0].startswith("<tool_call>")
    assert report["summary"]["accuracy"] == 0.8
    assert "tokyo-built-to-fail" in done.output


def test_min_accuracy_sets_the_exit_code(tmp_path: Path) -> None:
    args = ["eval", str(EXAMPLES / "eval_cases.yaml"), "-r", str(tmp_path / "r.json")]
    assert runner.invoke(app, [*args, "--min-accuracy", "0.8"]).exit_code == 0
    assert runner.invoke(app, [*args, "--min-accuracy", "0.81"]).exit_code == 1


def test_executed_case_runs_the_tool_and_checks_the_answer() -> None:
    suite = load_suite(EXAMPLES / "eval_cases.yaml")
    report = run_suite(suite)
    oslo = next(r for r in report.results if r.id == "oslo-executed")
    assert oslo.correct
    assert oslo.calls == [
        {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "fahrenheit"}}
    ]
    assert len(oslo.completions) == 2


def _suite(tmp_path: Path, text: str) -> Path:
    (tmp_path / "tools.py").write_text(
        "from hermes_agent import tool\n\n"
        "@tool\ndef add(a: int, b: int) -> int:\n    '''Add.'''\n    return a + b\n"
    )
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return path


def test_refused_and_malformed_calls_are_reported(tmp_path: Path) -> None:
    path = _suite(
        tmp_path,
        "tools: [tools.py]\ncases:\n"
        "  - {id: bad-args, question: '1+2?', expect: [{name: add, arguments: {a: 1, b: 2}}]}\n"
        "  - {id: garbled, question: '1+2?', expect: [{name: add, arguments: {a: 1, b: 2}}]}\n"
        "  - {id: unknown, question: '1+2?', expect: none}\n",
    )
    model = ScriptedModel(
        [
            '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
            "<tool_call>{not json</tool_call>",
            '<tool_call>{"name": "plus", "arguments": {}}</tool_call>',
        ]
    )
    report = run_suite(load_suite(path), model=model)
    bad, garbled, unknown = report.results
    assert not bad.correct and bad.invalid and bad.refused[0]["status"] == 400
    assert "missing required argument 'b'" in bad.refused[0]["error"]
    assert bad.error == "expected 1 call(s), got 0 (none)"
    assert garbled.malformed and not garbled.invalid and not garbled.correct
    assert unknown.invalid and unknown.refused[0]["status"] == 404
    assert not unknown.correct and unknown.error == "expected no call, the model tried plus"
    assert [s.to_dict()["invalid"] for s in report.categories()] == [2]


def test_matching_rules() -> None:
    assert values_equal(" Paris ", "paris")
    assert values_equal(2, 2.0) and not values_equal(True, 1)
    assert values_equal([1, "A"], [1.0, "a"]) and not values_equal([1], [1, 2])
    assert values_equal({"x": "A"}, {"x": "a"}) and not values_equal({"x": 1}, {"y": 1})
    want = ExpectedCall(name="f", arguments={"a": [1, 2], "b": ["", "x"], "c": [[1, 2]]})
    assert calls_mismatch([want], [{"name": "f", "arguments": {"a": 2, "c": [1, 2]}}]) is None
    assert calls_mismatch([want], [{"name": "f", "arguments": {"a": 3, "c": [1, 2]}}]) == (
        "f: 'a' is 3, expected one of [1, 2]"
    )
    assert calls_mismatch([want], [{"name": "f", "arguments": {"a": 1}}]) == (
        "f: missing argument 'c'"
    )
    assert calls_mismatch([want], [{"name": "f", "arguments": {"a": 1, "c": [1, 2], "d": 0}}]) == (
        "f: unexpected argument 'd'"
    )
    g = ExpectedCall(name="g")
    two = [{"name": "g", "arguments": {}}, {"name": "f", "arguments": {"a": 1, "c": [1, 2]}}]
    assert calls_mismatch([want, g], two) is None  # any order
    assert calls_mismatch([], two) == "expected 0 call(s), got 2 (g, f)"


def test_suite_errors_name_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("cases:\n  - {id: a, question: q, expect: none, colour: red}\n")
    with pytest.raises(ConfigError, match=r"s\.yaml: cases\.0\.colour: Extra inputs"):
        load_suite(path)
    path.write_text(
        "cases:\n  - {id: a, question: q, expect: none}\n  - {id: a, question: r, expect: none}\n"
    )
    with pytest.raises(ConfigError, match="two cases have the id 'a'"):
        load_suite(path)
    done = runner.invoke(app, ["eval", str(tmp_path / "missing.yaml")])
    assert done.exit_code == 2 and "cannot read the suite" in done.output


def test_evaluation_page_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_agent.evals import bfcl_compat, bfcl_install

    if not bfcl_compat.available():
        pytest.skip(bfcl_install.missing_message())
    monkeypatch.chdir(EXAMPLES.parent)
    text = (EXAMPLES.parent / "docs" / "evaluation.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    namespace: dict[str, object] = {"__name__": "docs_evaluation"}
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"evaluation.md (python block {number})", "exec"), namespace)
