"""The ``hermes-agent`` command, run as a real process (scripted model via config)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_agent.demo_tools import calculator, convert_units, current_datetime

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'


def hermes(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hermes_agent", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def scripted_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "model:\n  provider: scripted\n  responses:\n"
        f"    - {json.dumps(CALL)}\n"
        "    - '17 * 23 = 391'\n",
        encoding="utf-8",
    )
    return path


def test_run_json_prints_the_run_result(scripted_config: Path) -> None:
    done = hermes("run", "--config", str(scripted_config), "--json", "What is 17 * 23?")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == 200 and result["output"] == "17 * 23 = 391"
    assert result["tool_calls"][0]["name"] == "calculator"
    assert result["tool_calls"][0]["result"] == 391


def test_debug_prints_one_line_per_stage(scripted_config: Path) -> None:
    done = hermes("run", "--config", str(scripted_config), "--debug", "What is 17 * 23?")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("[INFO]")]
    stages = [line.split(":")[0].removeprefix("[INFO] ") for line in lines]
    assert stages == [
        "InputParser",
        "ThoughtGenerator",
        "ToolSelector",
        "ToolExecutor",
        "ThoughtGenerator",
        "OutputRenderer",
    ]
    assert "[INFO] ThoughtGenerator: status=200, selected_tools=['calculator']" in lines
    assert done.stdout.strip() == "17 * 23 = 391"


def test_hermes_debug_env_variable_turns_on_debug(scripted_config: Path) -> None:
    done = hermes("run", "--config", str(scripted_config), "hi", env={"HERMES_DEBUG": "1"})
    assert "[INFO] InputParser: status=200" in done.stderr


def test_user_tools_file_is_loaded(tmp_path: Path) -> None:
    tools_file = tmp_path / "my_tools.py"
    tools_file.write_text(
        "from hermes_agent import tool\n\n"
        "@tool\n"
        "def shout(text: str) -> str:\n"
        '    """Upper-case a text."""\n'
        "    return text.upper()\n",
        encoding="utf-8",
    )
    shout = '<tool_call>{"name": "shout", "arguments": {"text": "hey"}}</tool_call>'
    config = tmp_path / "config.yaml"
    config.write_text(
        f"model:\n  provider: scripted\n  responses:\n    - {json.dumps(shout)}\n    - done\n",
        encoding="utf-8",
    )
    done = hermes("run", "--config", str(config), "--tools", str(tools_file), "--json", "shout hey")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tool_calls"][0]["result"] == "HEY"
    listed = hermes("tools", "--tools", str(tools_file), "--json")
    names = [t["function"]["name"] for t in json.loads(listed.stdout)]
    assert names == ["calculator", "current_datetime", "convert_units", "shout"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--config", "absent.yaml", "hi"], "cannot read the config file"),
        (["run", "--tools", "absent.py", "hi"], "--tools absent.py: no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    args: list[str], message: str, tmp_path: Path
) -> None:
    done = hermes(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_failed_run_exits_1(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  provider: scripted\n  responses: []\n", encoding="utf-8")
    done = hermes("run", "--config", str(config), "hi")
    assert done.returncode == 1
    assert "ran out of responses" in done.stdout


def test_calculator_is_safe_and_correct() -> None:
    assert calculator("17 * 23") == 391
    assert calculator("2 ^ 10") == 1024
    assert calculator("sqrt(16) + pi - pi") == 4
    assert calculator("7 / 2") == 3.5
    for hostile in ["__import__('os').system('true')", "(1).__class__", "9 ** 9 ** 9", "open('x')"]:
        with pytest.raises(ValueError):
            calculator(hostile)


def test_unit_conversion_and_datetime() -> None:
    assert convert_units(1, "km", "m")["value"] == 1000
    assert convert_units(100, "c", "f")["value"] == 212
    with pytest.raises(ValueError, match="cannot convert length"):
        convert_units(1, "km", "kg")
    assert current_datetime("UTC").endswith("+00:00")
    with pytest.raises(ValueError, match="unknown timezone"):
        current_datetime("Mars/Base")


def test_chat_streams_answers_and_shows_calls_as_they_happen(scripted_config: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hermes_agent", "chat", "--config", str(scripted_config)],
        input="What is 17 * 23?\n/exit\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert '→ calculator({"expression": "17 * 23"})' in out
    assert "← calculator [200]" in out
    assert out.index("→ calculator") < out.index("17 * 23 = 391")
