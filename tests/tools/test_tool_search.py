"""Tool search: past ``agent.tool_search_threshold`` tools, the prompt carries ``search_tools``
and the few definitions that match the message best; a search loads the definitions it finds
for the next model turn. Measured against a real MCP server with 1,000 tools (the official SDK
over stdio, in a subprocess)."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from hermes_agent import Agent, ModelSettings, ScriptedModel, build_agent, tool
from hermes_agent.cli import app
from hermes_agent.config import parse_config
from hermes_agent.testing import tool_call as call
from hermes_agent.tools.search import SEARCH_TOOL, ToolIndex, narrowed, words
from hermes_agent.types import Message

SERVER = """
import sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("many")
VERBS = ["get", "list", "create", "update", "delete", "search", "export", "archive"]
THINGS = ["invoice", "customer", "order", "ticket", "shipment", "report", "user", "payment",
          "product", "refund", "contract", "campaign", "lead", "meeting", "document",
          "employee", "budget", "asset", "vendor", "project", "task", "alert", "device",
          "license"]
AREAS = ["sales", "support", "finance", "hr", "logistics"]


def make(name):
    def run(query: str, limit: int = 10) -> str:
        return f"{name}: {query}"
    return run


count = 0
for area in AREAS:
    for verb in VERBS:
        for thing in THINGS:
            name = f"{area}_{verb}_{thing}"
            server.add_tool(make(name), name=name, description=(
                f"{verb.capitalize()} {thing} records of the {area} department; the query "
                f"filters them by any of their fields."))
            count += 1
for n in range(1000 - count - 1):
    server.add_tool(make(f"misc_{n}"), name=f"misc_tool_{n}",
                    description=f"Miscellaneous internal operation number {n}.")
def weather(city: str) -> str:
    return f"sunny in {city}"
server.add_tool(weather, name="get_weather_forecast",
                description="Get the weather forecast for a city.")
server.run("stdio")
"""

QUESTION = "What is the weather forecast for Paris?"


def many_tools_agent(tmp_path: Path, model: ScriptedModel, threshold: int | None) -> Agent:
    script = tmp_path / "many_server.py"
    script.write_text(SERVER)
    data: dict[str, Any] = {
        "model": {"provider": "scripted"},
        "agent": {"tool_search_threshold": threshold, "tool_search_top_k": 3},
        "mcp_servers": {
            "many": {
                "command": sys.executable,
                "args": [str(script)],
                "max_tools": 2000,
                "timeout": 30,
                "connect_timeout": 60,
            }
        },
    }
    return build_agent(parse_config(data), model=model)


class PromptMeter:
    """A scripted model that searches, calls what it found, answers; and measures each
    turn's rendered prompt (characters) and the tools it was shown."""

    def __init__(self, *, search: bool) -> None:
        self.search = search
        self.prompt_chars: list[int] = []
        self.shown: list[set[str]] = []
        self.model = ScriptedModel(self.turn)

    def turn(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
        prompt = self.model.render_prompt(messages, tools, ModelSettings())
        self.prompt_chars.append(len(prompt))
        shown = {spec["function"]["name"] for spec in tools}
        self.shown.append(shown)
        calls = sum(1 for m in messages if m.role == "tool")
        if self.search and calls == 0:
            return call(SEARCH_TOOL, query="weather forecast for a city")
        if calls < (2 if self.search else 1):
            return call("get_weather_forecast", city="Paris")
        return "It is sunny in Paris."


def test_a_thousand_tools_are_searched_not_all_shown(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    meter = PromptMeter(search=True)
    agent = many_tools_agent(tmp_path, meter.model, threshold=64)
    try:
        assert len(agent.registry.names()) == 1000
        result = agent.run(QUESTION)
        assert [c.name for c in result.tool_calls] == [SEARCH_TOOL, "get_weather_forecast"]
        assert [c.status_code for c in result.tool_calls] == [200, 200]
        assert result.tool_calls[1].result == {"result": "sunny in Paris"}
        assert result.output == "It is sunny in Paris."
        first, second, third = meter.shown
        assert SEARCH_TOOL in first and len(first) == 4  # the search tool and top_k=3
        assert "get_weather_forecast" in first  # the message names what it needs
        assert first <= second == third and len(second) <= 4 + 10
    finally:
        agent.close()

    plain = PromptMeter(search=False)
    agent = many_tools_agent(tmp_path, plain.model, threshold=None)
    try:
        result = agent.run(QUESTION)
        assert [c.status_code for c in result.tool_calls] == [200]
        assert len(plain.shown[0]) == 1000
    finally:
        agent.close()
    # Every turn's prompt is a small fraction of the one that lists all 1,000 tools.
    assert max(meter.prompt_chars) * 20 < min(plain.prompt_chars)
    print(
        f"\nprompt chars per turn, 1000 tools: all {plain.prompt_chars}, "
        f"searched {meter.prompt_chars}"
    )


def test_an_unsearched_tool_is_still_callable(tmp_path: Path) -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    extra = [_numbered(n) for n in range(20)]
    agent = Agent(model=ScriptedModel([call("add", a=2, b=3), "5"]), tools=[add, *extra])
    agent.limits.tool_search_threshold = 5
    result = agent.run("nothing about arithmetic")
    assert [(c.name, c.status_code) for c in result.tool_calls] == [("add", 200)]


def test_below_the_threshold_every_tool_is_shown() -> None:
    tools = {f"t{n}": _numbered(n) for n in range(5)}
    specs: list[dict[str, Any]] = []
    assert narrowed(tools, "anything", specs, threshold=5) is None
    assert len(specs) == 5
    assert narrowed(tools, "anything", specs, threshold=None) is None


def test_the_ranking_is_bm25_over_name_and_description_and_deterministic() -> None:
    assert words("getWeather_forecast v2") == ["get", "weather", "forecast", "v2"]
    tools = [_numbered(n) for n in range(30)]
    index = ToolIndex.of(tools)
    assert index.search("operation 7 seven", 3)[0] == "op_7"
    assert index.search("operation", 3) == index.search("operation", 3)
    assert index.search("nothing matches zzz", 3) == []


def _numbered(n: int) -> Any:
    def run(x: int) -> int:
        return x

    from hermes_agent.tools.registry import Tool

    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    return Tool.from_function(
        run, name=f"op_{n}", description=f"Operation {names[n % 10]} on a number ({n})."
    )


PAGE = Path(__file__).resolve().parents[2] / "docs" / "mcp-security.md"
BLOCK = re.compile(r"<!-- (?P<mark>[^>]*?) -->\n```(?P<lang>\w+)\n(?P<body>.*?)```", re.S)


def test_the_pages_examples_run() -> None:
    """docs/mcp-security.md: its Python runs (its asserts are what the page claims), its
    config is valid and its command line is one the CLI accepts."""
    found = {m["mark"]: m["body"] for m in BLOCK.finditer(PAGE.read_text())}
    assert set(found) == {"run: python", "check: config", "check: cli"}
    exec(compile(found["run: python"], str(PAGE), "exec"), {})
    config = parse_config(yaml.safe_load(found["check: config"]))
    assert config.agent.tool_search_threshold == 64 and "files" in config.mcp_servers
    command = shlex.split(found["check: cli"])
    assert command[0] == "hermes-agent"
    parsed = CliRunner().invoke(app, [*command[1:], "--help"])
    assert parsed.exit_code == 0 and "--yes" in parsed.output
