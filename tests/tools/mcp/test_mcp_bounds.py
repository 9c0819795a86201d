"""What an MCP server the agent connects to can make it hold, against a misbehaving server of
our own (``mcp_misbehaving_server.py``, the official SDK over stdio): a listing past
``max_tools`` is refused at load, naming the setting; a result past ``max_result_bytes`` is an
error result that is neither shown to the model nor written to the trail; a call that never
ends (and keeps talking) ends at its timeout, and the agent goes on."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel
from hermes_agent.config import parse_config
from hermes_agent.errors import ConfigError
from hermes_agent.loading import build_agent
from hermes_agent.testing import tool_call
from server_harness import user_calls

pytest.importorskip("mcp")

SERVER = Path(__file__).resolve().parents[2] / "harness" / "mcp_misbehaving_server.py"


def _agent(tmp_path: Path, tools: int = 0, **server: Any) -> Agent:
    config = {
        "model": {"provider": "scripted"},
        "storage": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
        "mcp_servers": {
            "bad": {
                "command": sys.executable,
                "args": [str(SERVER)],
                "env": {"MISBEHAVE_TOOLS": str(tools)},
                **server,
            }
        },
    }
    return build_agent(parse_config(config), model=ScriptedModel(user_calls))


def test_a_listing_past_max_tools_is_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"mcp_servers\.bad: .*more than 20 tools \(max_tools\)"):
        _agent(tmp_path, tools=25, max_tools=20)


def test_a_result_past_max_result_bytes_is_an_error_and_is_kept_nowhere(tmp_path: Path) -> None:
    agent = _agent(tmp_path, max_result_bytes=100_000)
    try:
        small = agent.run(tool_call("huge", size=50_000))
        assert small.tool_calls[0].status_code == 200
        assert "x" * 50_000 in json.dumps(small.tool_calls[0].result)
        big = agent.run(tool_call("huge", size=1_000_000), session_id="big")
        refused = big.tool_calls[0]
        assert refused.status_code == 500, refused
        assert "max_result_bytes (100000)" in str(refused.error)
        assert agent.storage is not None
        trail = "\n".join(r.content for r in agent.storage.records(big.request_id))
        assert "x" * 1_000 not in trail and len(trail) < 100_000
    finally:
        agent.close()


def test_a_call_that_never_ends_stops_at_its_timeout_and_the_agent_goes_on(
    tmp_path: Path,
) -> None:
    agent = _agent(tmp_path, timeout=2)
    try:
        started = time.monotonic()
        stuck = agent.run(tool_call("forever"))
        took = time.monotonic() - started
        assert stuck.tool_calls[0].status_code == 408, stuck.tool_calls[0]
        assert took < 8, took
        after = agent.run(tool_call("huge", size=10), session_id="after")
        assert after.tool_calls[0].status_code == 200
    finally:
        agent.close()


def test_the_session_gives_a_call_more_time_than_the_executor_so_its_deadline_ends_it() -> None:
    """A call's session deadline falls after the tool's timeout (the executor's deadline):
    were they the same, the session's ``TimeoutError`` could fire first and read as the
    tool's own failure (500) instead of a timeout (408)."""
    from hermes_agent.config import McpServerConfig
    from hermes_agent.tools.mcp.client import DEADLINE_BACKUP, McpToolsets

    toolsets = McpToolsets({"srv": McpServerConfig(command="unused", timeout=3)})
    given: list[float] = []

    async def call(server: str, tool: str, arguments: dict[str, Any], timeout: float) -> str:
        given.append(timeout)
        return "ok"

    toolsets.call = call  # type: ignore[method-assign]
    try:
        call_tool = toolsets._caller("srv", "remote", [])
        assert asyncio.run(call_tool(x=1)) == "ok"
    finally:
        toolsets.close()
    assert DEADLINE_BACKUP > 0 and given == [3 + DEADLINE_BACKUP]
