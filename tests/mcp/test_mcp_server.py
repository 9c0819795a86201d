"""MCP tools out: ``hermes-agent mcp serve`` started as a real process, over stdio and over
streamable HTTP (uvicorn on loopback), driven by the official SDK's client. Every call goes
through the agent's tool pipeline: validation, approval, the audit trail."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel, tool
from hermes_agent.memory.session import InMemorySessionStore
from hermes_agent.storage import open_storage
from mcp_project import project_fixture  # noqa: F401  (the project fixture)
from server_harness import free_port

pytest.importorskip("mcp")

from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client


def serve_args(project: Path, *extra: str) -> list[str]:
    return [
        "-m",
        "hermes_agent",
        "mcp",
        "serve",
        "--config",
        str(project / "config.yaml"),
        "--tools",
        str(project / "tools.py"),
        "--no-demo-tools",
        "--ask",
        "--approve",
        "delete_file",
        *extra,
    ]


@asynccontextmanager
async def stdio_session(project: Path) -> AsyncIterator[Client]:
    parameters = StdioServerParameters(
        command=sys.executable, args=serve_args(project), cwd=str(project)
    )
    async with Client(stdio_client(parameters), read_timeout_seconds=30) as client:
        yield client


class HttpServer:
    """``hermes-agent mcp serve --transport http`` in a process of its own."""

    def __init__(self, project: Path, *extra: str) -> None:
        self.project = project
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/mcp"
        args = serve_args(project, "--transport", "http", "--port", str(port), *extra)
        self.process = subprocess.Popen(
            [sys.executable, *args],
            cwd=project,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return
            except OSError:
                assert self.process.poll() is None, self.stderr()
                assert time.monotonic() < deadline, "the MCP server did not start"
                time.sleep(0.1)  # the polling pace, bounded by the deadline above

    def stderr(self) -> str:
        return self.process.stderr.read() if self.process.stderr else ""

    def __enter__(self) -> HttpServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        """Killed if still running (a test that checks how it stops calls ``stop``)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> int:
        """SIGTERM, as a service manager stops it; its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)


def api_key(project: Path, user: str) -> str:
    """A key of the service's key store (the config's storage), as ``keys create`` makes."""
    from hermes_agent.runs.keys import SqlKeyStore

    keys = SqlKeyStore(f"sqlite:///{project / 'state.db'}")
    try:
        return keys.create(user)
    finally:
        keys.close()


def keyed_client(url: str, key: str) -> Client:
    """The SDK's client over streamable HTTP, sending ``key`` as a bearer token."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    return Client(streamable_http_client(url, http_client=http), read_timeout_seconds=30)


@pytest.fixture
def http_server(project: Path) -> Iterator[HttpServer]:
    with HttpServer(project) as server:
        yield server


async def exercise(client: Client, project: Path) -> None:
    """What both transports must show."""
    listed = {t.name: t for t in (await client.list_tools()).tools}
    assert set(listed) == {"multiply", "profile", "delete_file", "drop_table", "ask"}
    assert listed["multiply"].description == "Multiply two integers."
    assert listed["multiply"].input_schema == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }

    product = await client.call_tool("multiply", {"a": 6, "b": 7})
    assert (product.is_error, product.content[0].text) == (False, "42")  # type: ignore[union-attr]
    user = await client.call_tool("profile", {"name": "ada"})
    assert user.structured_content == {"name": "ada", "plan": "pro"}

    refused = await client.call_tool("multiply", {"a": "six", "b": 7})
    assert refused.is_error
    assert "'a' must be an integer" in refused.content[0].text  # type: ignore[union-attr]

    approved = await client.call_tool("delete_file", {"path": "notes.txt"})
    assert (approved.is_error, approved.content[0].text) == (False, "deleted notes.txt")  # type: ignore[union-attr]
    denied = await client.call_tool("drop_table", {"table": "users"})
    assert denied.is_error
    assert "--approve drop_table" in denied.content[0].text  # type: ignore[union-attr]

    answer = await client.call_tool("ask", {"message": "What is 6 * 7?"})
    assert answer.content[0].text == "The answer is 42."  # type: ignore[union-attr]
    assert answer.structured_content is not None
    assert answer.structured_content["status"] == 200
    again = await client.call_tool(
        "ask", {"message": "And now?", "session_id": answer.structured_content["session_id"]}
    )
    assert again.content[0].text == "Still 42."  # type: ignore[union-attr]

    with pytest.raises(MCPError, match="unknown tool 'nope'"):
        await client.call_tool("nope", {})

    # only valid, approved calls ran
    ran = (project / "ran.txt").read_text().split()
    assert ran == ["multiply", "profile", "delete_file"]


def check_the_trail(project: Path) -> None:
    storage = open_storage(f"sqlite:///{project / 'state.db'}")
    try:
        users = {}
        for summary in storage.requests(limit=50):
            records = storage.records(summary["request_id"])
            asked = next(r.content for r in records if r.role == "user")
            users[asked] = records
        call = 'MCP tools/call {"name": "multiply", "arguments": {"a": 6, "b": 7}}'
        assert call in users
        executed = [r for r in users[call] if r.stage == "ToolExecutor" and r.role == "tool"]
        assert '"data": 42' in executed[0].content
        denial = next(k for k in users if '"drop_table"' in k)
        selection = [r for r in users[denial] if r.stage == "ToolSelector"]
        rejected = json.loads(selection[0].content)["rejected"]
        assert [(r["name"], r["status"]) for r in rejected] == [("drop_table", 403)]
        assert "What is 6 * 7?" in users  # the ask tool's run
    finally:
        storage.close()


def test_stdio_server_driven_by_the_sdk_client(project: Path) -> None:
    async def main() -> None:
        async with stdio_session(project) as client:
            await exercise(client, project)

    asyncio.run(asyncio.wait_for(main(), 120))
    check_the_trail(project)


def test_http_server_driven_by_the_sdk_client(project: Path, http_server: HttpServer) -> None:
    key = api_key(project, "ada")

    async def main() -> None:
        async with keyed_client(http_server.url, key) as client:
            await exercise(client, project)

    asyncio.run(asyncio.wait_for(main(), 120))
    assert http_server.stop() == 0  # a graceful stop, which also flushes the trail
    assert "over MCP on " + http_server.url in http_server.stderr()
    check_the_trail(project)


def test_the_server_in_process_with_an_approver_of_its_own() -> None:
    from hermes_agent.mcp.server import AgentMcpServer

    @tool(requires_approval=True)
    def launch(target: str) -> str:
        """Launch something."""
        return f"launched {target}"

    asked: list[dict[str, Any]] = []

    def approver(call: Any, tool: Any) -> bool:
        asked.append(call.arguments)
        return call.arguments["target"] == "balloon"

    reads: list[str] = []

    class Sessions(InMemorySessionStore):
        def load(self, session_id: str) -> list[Any]:
            reads.append(session_id)
            return super().load(session_id)

    agent = Agent(ScriptedModel(["unused"]), tools=[launch], session_store=Sessions())
    server = AgentMcpServer(agent, approver=approver)

    async def main() -> tuple[Any, Any]:
        async with Client(server.lowlevel()) as client:
            yes = await client.call_tool("launch", {"target": "balloon"})
            no = await client.call_tool("launch", {"target": "rocket"})
            return yes, no

    try:
        yes, no = asyncio.run(main())
        assert (yes.is_error, yes.content[0].text) == (False, "launched balloon")
        assert no.is_error and "denied" in no.content[0].text
        assert asked == [{"target": "balloon"}, {"target": "rocket"}]
        assert reads == []  # each call's session is made up for it: no history to read
    finally:
        server.close()
        agent.close()


def test_serve_refuses_what_it_cannot_serve(project: Path) -> None:
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hermes_agent", "mcp", "serve", *args],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    wrong = serve("--transport", "smoke", "--no-demo-tools")
    assert wrong.returncode == 2 and "use stdio or http" in wrong.stderr
    unknown = serve("--no-demo-tools", "--tools", "tools.py", "--approve", "nuke")
    assert unknown.returncode == 2 and "--approve nuke: no such tool" in unknown.stderr
    assert unknown.stdout == ""  # stdout is the protocol's: nothing else goes there
