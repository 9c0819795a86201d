"""A malicious MCP server cannot make the agent read, hold and parse a message of any size:
each message is bounded while it arrives (twice ``max_result_bytes``, at least 1 MiB), over
stdio and streamable HTTP (event streams and JSON bodies). Against ``mcp_misbehaving_server.py``
(the official SDK, a real process): a 40 MB listing is refused naming the bound, and an event
loop beside it (the service's, say) keeps its heartbeat — the SDK alone parsed such a listing
holding the GIL, stalling every thread for seconds; a result past the bound fails the
session, and the next call starts the server again."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_agent import ScriptedModel
from hermes_agent.config import McpServerConfig, parse_config
from hermes_agent.errors import ConfigError
from hermes_agent.loading import build_agent
from hermes_agent.testing import tool_call

pytest.importorskip("mcp")

from hermes_agent.tools.mcp import open_mcp_toolsets
from server_harness import free_port, user_calls

SERVER = Path(__file__).resolve().parents[2] / "harness" / "mcp_misbehaving_server.py"
HUGE_LISTING = 40_000_000
"""Characters of the padded tool's description: a 40 MB ``tools/list`` answer."""


def _stdio(listing_bytes: int = 0, **extra: Any) -> McpServerConfig:
    env = {"MISBEHAVE_LISTING_BYTES": str(listing_bytes)}
    return McpServerConfig(command=sys.executable, args=[str(SERVER)], env=env, **extra)


def _http_server(kind: str, listing_bytes: int) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "MISBEHAVE_LISTING_BYTES": str(listing_bytes)}
    process = subprocess.Popen(
        [sys.executable, str(SERVER), kind, str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)  # the polling pace, bounded by the deadline above
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait(10)


@pytest.fixture(params=["http", "json"])
def huge_http(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _http_server(request.param, HUGE_LISTING)


def _load_beside_a_heartbeat(config: McpServerConfig) -> tuple[BaseException | None, float]:
    """Load ``config``'s tools from a thread while this thread's event loop beats every
    10 ms: what loading raised, and the loop's longest late beat (seconds)."""

    async def main() -> tuple[BaseException | None, float]:
        worst = 0.0
        loading = asyncio.ensure_future(asyncio.to_thread(open_mcp_toolsets, {"bad": config}))
        while not loading.done():
            before = time.perf_counter()
            await asyncio.sleep(0.01)  # a measured tick: how late the loop wakes from it
            worst = max(worst, time.perf_counter() - before - 0.01)
        error = loading.exception()
        if error is None:
            loading.result().close()
        return error, worst

    return asyncio.run(main())


def test_a_huge_listing_over_stdio_is_refused_while_it_arrives_and_nothing_stalls() -> None:
    error, lag = _load_beside_a_heartbeat(_stdio(HUGE_LISTING))
    assert isinstance(error, ConfigError), error
    assert "more than 2000000 bytes" in str(error) and "max_result_bytes" in str(error)
    # The SDK alone stalled the process 2.6-6.75 s parsing such a listing.
    assert lag < 1.0, f"the event loop stalled {lag:.2f} s"


def test_a_huge_listing_over_http_is_refused_while_it_arrives_and_nothing_stalls(
    huge_http: str,
) -> None:
    error, lag = _load_beside_a_heartbeat(McpServerConfig(url=huge_http))
    assert isinstance(error, ConfigError), error
    assert "more than 2000000 bytes" in str(error) and "max_result_bytes" in str(error)
    assert lag < 1.0, f"the event loop stalled {lag:.2f} s"


def test_the_bound_follows_max_result_bytes_and_a_listing_within_it_loads() -> None:
    toolsets = open_mcp_toolsets({"ok": _stdio(1_500_000, max_tools=1000)})  # within 2 MB
    try:
        assert "padded_0" in {tool.name for tool in toolsets.tools}
    finally:
        toolsets.close()
    with pytest.raises(ConfigError, match=r"more than 1048576 bytes.*max_result_bytes \(100\)"):
        open_mcp_toolsets({"small": _stdio(1_500_000, max_result_bytes=100)})


def test_a_result_past_the_bound_fails_the_session_and_the_next_call_starts_afresh(
    tmp_path: Path,
) -> None:
    config = {
        "model": {"provider": "scripted"},
        "storage": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
        "mcp_servers": {"bad": {"command": sys.executable, "args": [str(SERVER)]}},
    }
    agent = build_agent(parse_config(config), model=ScriptedModel(user_calls))
    try:
        big = agent.run(tool_call("huge", size=5_000_000))
        refused = big.tool_calls[0]
        assert refused.status_code == 500, refused
        assert "more than 2000000 bytes" in str(refused.error), refused.error
        after = agent.run(tool_call("huge", size=10), session_id="after")
        assert after.tool_calls[0].status_code == 200, after.tool_calls[0]
    finally:
        agent.close()
