"""An MCP tool whose definition cannot be used costs that tool, not its server: it is left out
when the agent is built, with a warning that names it and why (``McpToolsets.unusable``), as
a tool changed since it was approved is (``.refused``); the server's other tools work.

Against ``mcp_misbehaving_server.py`` (the official SDK, a real process over stdio), which
lists a tool whose schema has a ``$ref`` to another document (a loopback socket that counts
who connects: nothing is fetched) and a tool whose pattern has a backreference (RE2 refuses
it)."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_agent import ScriptedModel
from hermes_agent.config import McpServerConfig, parse_config
from hermes_agent.loading import build_agent

pytest.importorskip("mcp")

from hermes_agent.tools.mcp import open_mcp_toolsets

SERVER = Path(__file__).resolve().parents[2] / "harness" / "mcp_misbehaving_server.py"


@pytest.fixture
def elsewhere() -> Iterator[socket.socket]:
    """A loopback socket the bad ``$ref`` points at: one that was fetched would connect."""
    listening = socket.create_server(("127.0.0.1", 0))
    listening.setblocking(False)
    try:
        yield listening
    finally:
        listening.close()


def nobody_connected(listening: socket.socket) -> bool:
    try:
        listening.accept()[0].close()
    except BlockingIOError:
        return True
    return False


def where(listening: socket.socket) -> str:
    return f"http://127.0.0.1:{listening.getsockname()[1]}/profile-schema.json"


def _server(ref_url: str) -> dict[str, object]:
    env = {"MISBEHAVE_SCHEMA_REF": ref_url, "MISBEHAVE_SCHEMA_PATTERN": r"^(a)\1$"}
    return {"command": sys.executable, "args": [str(SERVER)], "env": env, "timeout": 20}


def test_unusable_tools_are_left_out_and_the_server_kept(
    elsewhere: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    url = where(elsewhere)
    caplog.set_level(logging.WARNING, logger="hermes_agent.tools.mcp")
    toolsets = open_mcp_toolsets({"bad": McpServerConfig.model_validate(_server(url))})
    try:
        assert sorted(t.name for t in toolsets.tools) == ["forever", "huge"]
        assert sorted(toolsets.unusable) == ["bad"]
        reasons = toolsets.unusable["bad"]
        assert sorted(reasons) == ["patterned", "referenced"]
        assert "names another document" in reasons["referenced"]
        assert url in reasons["referenced"]
        assert toolsets.refused == {}
        result = toolsets.run(toolsets.call("bad", "huge", {"size": 3}, 20), 25)
        assert "xxx" in str(result)
    finally:
        toolsets.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for tool in ("referenced", "patterned"):
        [line] = [w for w in warnings if f"tool {tool!r} cannot be used" in w]
        assert "mcp_servers.bad" in line and f"exclude_tools: [{tool}]" in line
    assert nobody_connected(elsewhere)


def test_an_agent_builds_without_the_unusable_tools(
    elsewhere: socket.socket, tmp_path: Path
) -> None:
    url = where(elsewhere)
    config = parse_config(
        {
            "model": {"provider": "scripted"},
            "storage": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "mcp_servers": {"bad": _server(url)},
        }
    )
    agent = build_agent(config, model=ScriptedModel(["hi"]))
    try:
        names = agent.registry.names()
        assert "huge" in names and "referenced" not in names and "patterned" not in names
    finally:
        agent.close()
    assert nobody_connected(elsewhere)
