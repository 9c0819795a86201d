"""Building an agent from a config (``build_agent``, ``load_tools_file``), where a configured agent
keeps things, and the line between the library and the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hermes_agent import Agent, ConfigError, HermesConfig, ScriptedModel, build_agent
from hermes_agent.config import ScriptedConfig
from hermes_agent.loading import ToolsFileError, load_tools_file

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hermes_agent"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CALL = '<tool_call>{"name": "shout", "arguments": {"text": "hey"}}</tool_call>'

TOOLS_FILE = '''
from hermes_agent import tool

@tool
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()

def whisper(text: str) -> str:
    """Lower-case a text."""
    return text.lower()

TOOLS = [whisper]
'''


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def scripted_config(folder: Path, *responses: str, extra: str = "") -> Path:
    lines = "".join(f"    - {json.dumps(r)}\n" for r in responses)
    return write(
        folder / "config.yaml",
        f"model:\n  provider: scripted\n  responses:\n{lines}agent:\n  max_iterations: 3\n{extra}",
    )


# -- build_agent ---------------------------------------------------------------------------


def test_build_agent_from_a_file_with_a_tools_file(tmp_path: Path) -> None:
    config = scripted_config(tmp_path, CALL, "HEY it is.")
    tools = write(tmp_path / "my_tools.py", TOOLS_FILE)
    agent = build_agent(config, tools_files=[tools])
    assert sorted(t.name for t in agent.tools) == ["shout", "whisper"]
    assert agent.limits.max_iterations == 3
    result = agent.run("shout hey")
    assert result.output == "HEY it is."
    assert [(c.name, c.result) for c in result.tool_calls] == [("shout", "HEY")]


def test_build_agent_from_settings_with_overrides(tmp_path: Path) -> None:
    settings = HermesConfig(model=ScriptedConfig(responses=["unused"]))
    agent = build_agent(settings, model=ScriptedModel(["overridden"]), tool_choice="none")
    assert agent.tool_choice == "none"
    assert agent.run("hi").output == "overridden"


def test_a_tools_file_replaces_a_tool_of_the_same_name(tmp_path: Path) -> None:
    def shout(text: str) -> str:
        """The old one."""
        return text

    tools = write(tmp_path / "my_tools.py", TOOLS_FILE)
    agent = build_agent(None, tools_files=[tools], model=ScriptedModel(["ok"]), tools=[shout])
    assert next(t for t in agent.tools if t.name == "shout").description == "Upper-case a text."


def test_no_config_gives_the_agent_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    agent = build_agent()
    assert agent.storage is None and agent.limits.max_iterations == Agent().limits.max_iterations
    assert list(tmp_path.iterdir()) == []


def test_a_bad_config_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"absent\.yaml: cannot read the config file"):
        build_agent(tmp_path / "absent.yaml")
    bad = write(tmp_path / "bad.yaml", "model:\n  provider: scripted\n  temprature: 1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: model\.temprature: unknown key"):
        build_agent(bad)


def test_a_bad_tools_file_opens_no_storage(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    config = scripted_config(tmp_path, "hi", extra=f"storage:\n  url: sqlite:///{db}\n")
    with pytest.raises(ToolsFileError, match="no such file"):
        build_agent(config, tools_files=[tmp_path / "absent.py"])
    assert not db.exists()


# -- load_tools_file -----------------------------------------------------------------------


def test_load_tools_file_finds_decorated_tools_and_the_tools_list(tmp_path: Path) -> None:
    found = load_tools_file(write(tmp_path / "my_tools.py", TOOLS_FILE))
    assert sorted(t.name for t in found) == ["shout", "whisper"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "no such file"),
        ("raise RuntimeError('boom')\n", "importing it failed at "),
        ("def helper() -> None:\n    pass\n", "no tools found; decorate functions"),
    ],
)
def test_load_tools_file_errors_name_the_file_and_the_problem(
    tmp_path: Path, text: str | None, problem: str
) -> None:
    path = tmp_path / "tools.py"
    if text is not None:
        write(path, text)
    with pytest.raises(ConfigError) as caught:
        load_tools_file(path)
    assert isinstance(caught.value, ToolsFileError) and caught.value.path == path
    assert str(caught.value) == f"tools file {path}: {caught.value.problem}"
    assert caught.value.problem.startswith(problem)


# -- where a configured agent keeps things ------------------------------------------------


def test_from_config_without_storage_keeps_nothing_on_disk(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = scripted_config(tmp_path, "hello")
    monkeypatch.chdir(tmp_path)
    agent = Agent.from_config(config)
    assert agent.storage is None and agent.audit_sink is None
    assert agent.run("hi", session_id="s").output == "hello"
    agent.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_from_config_with_a_storage_section_stores_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    db = tmp_path / "kept.db"
    config = scripted_config(tmp_path, "hello", extra=f"storage:\n  url: sqlite:///{db}\n")
    monkeypatch.chdir(tmp_path)
    agent = Agent.from_config(config)
    agent.run("hi", session_id="s")
    agent.close()
    assert db.is_file() and not (tmp_path / ".hermes").exists()


def test_eval_writes_only_its_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from hermes_agent.cli import app

    scripted_config(tmp_path, '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    write(
        tmp_path / "suite.yaml",
        f"name: one\nconfig: config.yaml\ntools: [{EXAMPLES / 'eval_tools.py'}]\ncases:\n"
        "  - id: oslo\n    question: Weather in Oslo?\n"
        "    expect: [{name: get_weather, arguments: {city: Oslo}}]\n",
    )
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, ["eval", "suite.yaml", "--quiet"])
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hermes", "config.yaml", "suite.yaml"]
    assert [p.name for p in (tmp_path / ".hermes").iterdir()] == ["eval-report.json"]


def test_the_command_line_keeps_its_default_storage(tmp_path: Path) -> None:
    config = scripted_config(tmp_path, "hello")

    def hermes(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hermes_agent", *args, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**os.environ, "HERMES_DEBUG": ""},
        )

    listed = hermes("tools", "--json")
    assert listed.returncode == 0, listed.stderr
    assert not (tmp_path / ".hermes").exists()  # listing tools opens no database
    ran = hermes("run", "hi", "--session", "kept")
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / ".hermes" / "state.db").is_file()
    shown = hermes("sessions", "list", "--json")
    assert [s["id"] for s in json.loads(shown.stdout)] == ["kept"]
