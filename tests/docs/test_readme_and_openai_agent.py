"""The README's library example, run as written, and the Agent over a real HTTP endpoint."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from hermes_agent import Agent, OpenAICompatible
from openai_server import (  # noqa: F401  (running_fixture, server_fixture: the fixtures)
    ScriptedServer,
    call,
    running_fixture,
    server_fixture,
    text,
    tool_calls,
)

README = Path(__file__).resolve().parents[2] / "README.md"
WEATHER_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Beijing"}}\n</tool_call>'
)


def readme_block(language: str, containing: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    return next(block for block in blocks if containing in block)


def test_readme_example_runs_as_written(
    server: ScriptedServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = readme_block("yaml", "provider: openai").replace(
        "http://localhost:8080/v1", server.base_url
    )
    (tmp_path / "config.yaml").write_text(config, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-readme-test")
    server.push(text(WEATHER_CALL), text("It is 23 °C in Beijing."))

    exec(compile(readme_block("python", "Agent.from_config"), "README.md", "exec"), {})

    assert capsys.readouterr().out == "It is 23 °C in Beijing.\n"
    first, second = server.requests
    assert first["model"] == "hermes-3" and first["temperature"] == 0.2
    assert "<tools>" in first["messages"][0]["content"] and "tools" not in first
    assert '"name": "get_weather"' in first["messages"][0]["content"]
    result = json.loads(second["messages"][-1]["content"].split("\n")[1])
    assert result["name"] == "get_weather"
    assert result["content"]["status"] == "success"
    assert result["content"]["data"] == {"city": "Beijing", "temperature": 23, "unit": "celsius"}


def weather_agent(server: ScriptedServer, mode: str) -> Agent:
    agent = Agent(model=OpenAICompatible("hermes-3", base_url=server.base_url, mode=mode))  # type: ignore[arg-type]

    @agent.tool
    def get_weather(city: str) -> dict:
        """Current weather for a city."""
        return {"city": city, "temperature": 23}

    return agent


@pytest.mark.parametrize("mode", ["native", "hermes"])
def test_agent_over_http_in_both_modes_with_streaming(server: ScriptedServer, mode: str) -> None:
    first = (
        tool_calls(call("get_weather", {"city": "Paris"}))
        if mode == "native"
        else text(WEATHER_CALL.replace("Beijing", "Paris"))
    )
    server.push(first, text("Sunny, 23 degrees."))
    agent = weather_agent(server, mode)

    async def collect() -> list:
        return [event async for event in agent.astream("Weather in Paris?")]

    events = asyncio.run(collect())
    result = events[-1].data["result"]
    assert result.status == 200 and result.output == "Sunny, 23 degrees."
    assert result.tool_calls[0].arguments == {"city": "Paris"}
    assert result.tool_calls[0].result == {"city": "Paris", "temperature": 23}
    assert result.usage.requests == 2 and result.usage.prompt_tokens > 0
    assert all(request["stream"] for request in server.requests)
    if mode == "native":
        tool_message = server.requests[1]["messages"][-1]
        assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_get_weather"


def test_endpoint_down_is_a_502_result(server: ScriptedServer) -> None:
    from openai_server import free_port

    agent = Agent(
        model=OpenAICompatible("x", base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=0)
    )
    result = agent.run("hi")
    assert result.status == 502
    assert "Is the server running" in (result.error or "")
