"""The embedded model end to end, through the real CLI process and through the library."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from hermes_agent import Agent, Status
from hermes_agent.demo_tools import calculator, demo_tools


def hermes_agent_command() -> list[str]:
    # The console script when installed on PATH (as the README uses it), else the module.
    script = shutil.which("hermes-agent")
    return [script] if script else [sys.executable, "-m", "hermes_agent"]


def test_cli_required_tool_choice_runs_the_calculator(tmp_path: Path) -> None:
    done = subprocess.run(
        [*hermes_agent_command(), "run", "--json", "--tool-choice", "required", "What is 17 * 23?"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HERMES_DEBUG": "0"},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] in (200, 206)
    first = result["tool_calls"][0]
    # The grammar makes the call valid by construction; the calculator really ran on the
    # arguments the model chose, and its result is in the RunResult.
    assert first["name"] == "calculator", first
    assert first["status_code"] == 200, first
    assert first["result"] == calculator(first["arguments"]["expression"])
    assert result["steps"][0]["completion_text"].startswith("<tool_call>")
    assert result["usage"]["completion_tokens"] > 0


def test_debug_run_prints_five_stage_lines(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *hermes_agent_command(),
            "run",
            "--debug",
            "--tool-choice",
            "required",
            "What is 17 * 23?",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    stages = {
        line.split(":")[0].removeprefix("[INFO] ")
        for line in done.stderr.splitlines()
        if line.startswith("[INFO] ") and not line.startswith("[INFO] storage:")
    }
    assert stages == {
        "InputParser",
        "ThoughtGenerator",
        "ToolSelector",
        "ToolExecutor",
        "OutputRenderer",
        "ToolCall",  # each call's arguments, masked and bounded
    }
    assert "status=200" in done.stderr
    assert 'name=calculator, arguments={"expression": "17 * 23"}' in done.stderr, done.stderr


def test_greeting_with_auto_tool_choice_is_plain_text() -> None:
    agent = Agent(tools=demo_tools())
    result = agent.run("Hello! How are you today?", tool_choice="auto")
    assert result.status == Status.OK, result
    assert result.output.strip()
    assert "<tool_call>" not in result.output
    if result.tool_calls:  # a tiny model may still reach for a tool; then it must have run
        assert all(call.status_code == 200 for call in result.tool_calls)


def test_cli_quick_start_calls_the_calculator_without_being_told(tmp_path: Path) -> None:
    # No --tool-choice: the embedded model decides on its own (LlamaCpp.call_bias) to call.
    done = subprocess.run(
        [*hermes_agent_command(), "run", "--json", "What is 17 * 23?"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HERMES_DEBUG": "0"},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["steps"][0]["completion_text"].startswith('<tool_call>\n{"name": "calculator"')
    ran = [c for c in result["tool_calls"] if c["status_code"] == 200]
    assert ran and ran[0]["name"] == "calculator", result["tool_calls"]
    assert ran[0]["result"] == calculator(ran[0]["arguments"]["expression"])
