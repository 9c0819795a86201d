"""Small things a user of the design documents hits first: --toolsets and agent.toolsets, a
tools file written as a script (``agent = Agent()``), the tool arguments in --debug, and the
runtime's own messages in Chinese (agent.language, or a run's ``lang`` variable)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cli_harness import hermes
from hermes_agent import Agent, ScriptedModel, build_agent
from hermes_agent.config import parse_config
from hermes_agent.errors import ModelError
from hermes_agent.loading import load_tools_file
from hermes_agent.messages import LanguageHook, language_of, text, translate_output
from hermes_agent.types import Message

TOOLS_FILE = '''
from hermes_agent import Agent

agent = Agent()


@agent.tool
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


@agent.tool(toolset="weather")
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: sunny"
'''


def scripted(folder: Path, *responses: str, extra: str = "") -> Path:
    path = folder / "config.yaml"
    listed = "".join(f"\n    - {json.dumps(response)}" for response in responses)
    path.write_text(f"model:\n  provider: scripted\n  responses:{listed}\n{extra}", "utf-8")
    return path


def call(name: str, **arguments: Any) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def test_a_tools_file_written_as_a_script_gives_its_agents_tools(tmp_path: Path) -> None:
    tools_file = tmp_path / "script_tools.py"
    tools_file.write_text(TOOLS_FILE, "utf-8")
    assert sorted(tool.name for tool in load_tools_file(tools_file)) == ["get_weather", "shout"]


def test_toolsets_on_the_command_line_narrow_and_debug_shows_masked_bounded_arguments(
    tmp_path: Path,
) -> None:
    tools_file = tmp_path / "script_tools.py"
    tools_file.write_text(TOOLS_FILE, "utf-8")
    secret = "sk-" + "a1" * 10
    config = scripted(
        tmp_path,
        call("shout", text=f"key {secret} " + "长" * 400),
        "done",
        extra="audit:\n  redact_patterns: ['sk-[A-Za-z0-9]+']\n",
    )
    done = hermes(
        tmp_path,
        *("run", "--config", str(config), "--tools", str(tools_file), "--no-demo-tools"),
        *("--toolsets", "weather", "--debug", "--json", "shout it"),
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # shout is not in the weather toolset: the model is told it does not exist.
    assert result["tool_calls"][0]["status_code"] == 404
    lines = [line for line in done.stderr.splitlines() if line.startswith("[INFO] ToolCall:")]
    assert len(lines) == 1 and lines[0].startswith(
        '[INFO] ToolCall: step=0, name=shout, arguments={"text": "key '
    )
    assert secret not in done.stderr and "[REDACTED]" in lines[0]
    assert lines[0].endswith("…") and len(lines[0]) < 400

    unknown = hermes(
        tmp_path,
        *("run", "--config", str(config), "--no-demo-tools", "--tools", str(tools_file)),
        *("--toolsets", "weather,finance", "hi"),
    )
    assert unknown.returncode == 2
    assert "--toolsets: no tools in finance; the toolsets are: default, weather" in unknown.stderr


def test_agent_toolsets_in_the_config(tmp_path: Path) -> None:
    config = parse_config(
        {
            "model": {"provider": "scripted", "responses": [call("shout", text="a"), "ok"]},
            "agent": {"toolsets": ["weather"]},
        }
    )
    tools_file = tmp_path / "script_tools.py"
    tools_file.write_text(TOOLS_FILE, "utf-8")
    agent = build_agent(config, tools_files=[tools_file])
    assert agent.toolsets == ["weather"]
    assert agent.run("shout a").tool_calls[0].status_code == 404
    given = build_agent(config, tools_files=[tools_file], toolsets=["default"])
    assert given.toolsets == ["default"]  # what the code says wins over the file


def loop_forever(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
    return call("shout", text="again")


def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


def test_a_partial_answer_in_chinese_from_the_config() -> None:
    config = parse_config(
        {"model": {"provider": "scripted"}, "agent": {"language": "zh", "max_iterations": 2}}
    )
    agent = build_agent(config, model=ScriptedModel(loop_forever), tools=[shout])
    result = agent.run("一直调用")
    assert result.status == 206
    assert result.output.startswith("已执行 2 步，仍未得到最终答案。\n最近的工具结果：\n- shout(")


def test_a_model_failure_in_chinese_keeps_the_detail() -> None:
    def broken(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
        raise ModelError("upstream answered 503")

    config = parse_config({"model": {"provider": "scripted"}, "agent": {"language": "zh"}})
    result = build_agent(config, model=ScriptedModel(broken)).run("你好")
    assert result.status == 502
    assert result.output.startswith("模型服务暂时出错，请稍后再试。\n详情：")
    assert "upstream answered 503" in result.output


def test_the_runs_lang_variable_chooses_per_run() -> None:
    agent = Agent(ScriptedModel(loop_forever), tools=[shout], max_iterations=1)
    agent.add_hook("post_output", LanguageHook())
    english = agent.run("loop")
    assert english.output.startswith("I stopped after 1 steps")
    chinese = agent.run("loop", variables={"lang": "zh-CN"})
    assert chinese.output.startswith("已执行 1 步，仍未得到最终答案。")


def test_an_answer_the_model_wrote_is_never_translated() -> None:
    config = parse_config(
        {"model": {"provider": "scripted", "responses": ["Hello!"]}, "agent": {"language": "zh"}}
    )
    assert build_agent(config).run("hi").output == "Hello!"
    assert translate_output("Hello!", 200, "zh") == "Hello!"


@pytest.mark.parametrize(
    ("tag", "language"), [("zh", "zh"), ("zh-Hans", "zh"), ("ZH_cn", "zh"), ("fr", "en"), (3, "en")]
)
def test_language_tags(tag: Any, language: str) -> None:
    assert language_of(tag) == language


def test_every_message_has_both_languages() -> None:
    from hermes_agent.messages import MESSAGES

    for key, entry in MESSAGES.items():
        assert set(entry) == {"en", "zh"}, key
    assert text("quota", "zh") == "您今天的使用次数已达上限，请明天再试。"
    assert text("quota", "fr") == text("quota", "en")
