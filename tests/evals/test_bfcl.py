"""The BFCL harness: data, schema conversion, BFCL's checkers, the oracle, the CLI, and the
harness's own bfcl-eval folder (``eval bfcl --setup``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hermes_agent import ScriptedModel
from hermes_agent.cli import app
from hermes_agent.evals import bfcl_compat, bfcl_install
from hermes_agent.evals.bfcl import (
    CATEGORIES,
    BfclHarness,
    convert_parameters,
    load_cases,
    oracle_model_for,
    shared_model,
    to_tool,
)
from hermes_agent.evals.oracle import DATA_CONFLICTS, parse_call_string

runner = CliRunner()
needs_bfcl = pytest.mark.skipif(not bfcl_compat.available(), reason=bfcl_install.missing_message())


@needs_bfcl
@pytest.mark.parametrize("category", CATEGORIES)
def test_oracle_passes_the_first_20_cases_but_known_data_conflicts(category: str) -> None:
    cases = load_cases(category, 20)
    report = BfclHarness(oracle_model_for).run(cases)
    assert report.total == min(20, len(cases)) and report.total >= 16  # live_(ir)relevance: 16
    conflicts = {c.id for c in cases} & set(DATA_CONFLICTS)
    assert {r.id for r in report.failures()} == conflicts
    for result in report.results:
        assert result.completions and not result.malformed
        # A conflict's only passing answer breaks the declared schema: the pipeline refuses it.
        assert result.invalid == (result.id in conflicts)


def test_data_conflicts_name_real_categories() -> None:
    for case_id, reason in DATA_CONFLICTS.items():
        assert any(case_id.startswith(f"{name}_") for name in CATEGORIES), case_id
        assert len(reason) > 20


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


@needs_bfcl
def test_ast_checker_is_imported_without_vendor_sdks() -> None:
    checker = bfcl_compat.ast_checker()
    assert callable(checker)
    assert "bfcl_eval.constants.model_config" not in sys.modules  # the stand-in is gone again
    assert "bfcl_eval.model_handler.api_inference.claude" not in sys.modules


@needs_bfcl
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


@needs_bfcl
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


@needs_bfcl
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
    assert report["settings"]["bfcl_eval"] == bfcl_install.VERSION
    assert [c["category"] for c in report["summary"]["categories"]] == [
        "parallel",
        "multi_turn_base",
    ]
    assert report["cases"][0]["completions"][0].startswith("<tool_call>")
    assert report["cases"][0]["verdict"] == {"valid": True, "error": []}

    bad = runner.invoke(app, ["eval", "bfcl", "--category", "web_search"])
    assert bad.exit_code == 2 and "unknown BFCL category web_search" in bad.output


@needs_bfcl
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


# -- the harness's own bfcl-eval folder -------------------------------------------------------


@needs_bfcl
def test_the_harness_imports_bfcl_from_its_own_folder_not_site_packages() -> None:
    # What the README's `eval bfcl --setup` installed is what the tests run against, and that
    # folder is not on sys.path: pip sees no bfcl-eval and its 27 unmet requirements.
    site = bfcl_compat.package_folder().parent
    assert site == bfcl_install.install_dir()
    assert str(site) not in sys.path
    assert bfcl_compat.installed_version() == bfcl_install.VERSION


def _fake_bfcl_wheel(folder: Path) -> Path:
    """A wheel named like bfcl-eval, with a requirement that is not installed anywhere, so a
    copy that landed in the environment's packages would break ``pip check``."""
    folder.mkdir()
    info = f"bfcl_eval-{bfcl_install.VERSION}.dist-info"
    wheel = folder / f"bfcl_eval-{bfcl_install.VERSION}-py3-none-any.whl"
    files = {
        "bfcl_eval/__init__.py": "MARK = 'fake'\n",
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: bfcl-eval\nVersion: {bfcl_install.VERSION}\n"
            "Requires-Dist: package-that-does-not-exist\n"
        ),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        record = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
        archive.writestr(f"{info}/RECORD", record)
    return wheel


def test_setup_installs_bfcl_eval_into_its_own_folder_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels = _fake_bfcl_wheel(tmp_path / "wheels").parent
    target = tmp_path / "bfcl"
    # pip (a subprocess) reads these: the local wheel only, and no cache outside tmp_path.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    monkeypatch.setenv(bfcl_install.ENV_VAR, str(target))

    done = runner.invoke(app, ["eval", "bfcl", "--setup"])
    assert done.exit_code == 0, done.output
    assert f"bfcl-eval {bfcl_install.VERSION} installed in {target}" in done.output
    assert (target / "bfcl_eval" / "__init__.py").read_text() == "MARK = 'fake'\n"
    assert bfcl_install.version_in(target) == bfcl_install.VERSION
    spec = bfcl_install.find_package()
    assert spec is not None and spec.origin == str(target / "bfcl_eval" / "__init__.py")
    # Nothing reached the environment: no bfcl-eval distribution from this folder is visible.
    visible = [Path(str(d.locate_file(""))) for d in metadata.distributions(name="bfcl-eval")]
    assert target not in visible

    again = runner.invoke(app, ["eval", "bfcl", "--setup"])
    assert again.exit_code == 0 and "already installed" in again.output

    suite = runner.invoke(app, ["eval", "cases.yaml", "--setup"])
    assert suite.exit_code == 2 and "--setup is for the BFCL harness" in suite.output


def test_without_bfcl_eval_the_harness_names_the_setup_command(tmp_path: Path) -> None:
    # A fresh process: in this one bfcl_eval may already be imported.
    empty = tmp_path / "no-bfcl"
    done = subprocess.run(
        [sys.executable, "-c", "from hermes_agent.cli import main; main()", "eval", "bfcl"],
        cwd=tmp_path,
        env={**os.environ, bfcl_install.ENV_VAR: str(empty)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    message = " ".join(done.stderr.split())
    assert "hermes-agent eval bfcl --setup" in message and str(empty) in message
    assert list(tmp_path.iterdir()) == []  # no folder made, no report written
