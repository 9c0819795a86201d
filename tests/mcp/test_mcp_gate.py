"""The MCP server as a front door of the run layer, attacked: over HTTP without a key, with a
bad key, naming another user's session through ``ask`` (over HTTP and stdio), and started on a
non-loopback host without auth. Real ``hermes-agent mcp serve`` processes, the SDK's client."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hermes_agent import Agent, ScriptedModel
from hermes_agent.storage import open_storage
from hermes_agent.types import Message

pytest.importorskip("mcp")

from mcp_project import project_fixture  # noqa: F401  (the project fixture)
from test_mcp_server import (
    HttpServer,
    api_key,
    keyed_client,
    serve_args,
    stdio_session,
)

ALICE_DIARY = "alice:diary"
"""Where the REST service keeps alice's session ``diary``."""


def _seed_alice(project: Path) -> None:
    storage = open_storage(f"sqlite:///{project / 'state.db'}")
    try:
        storage.sessions.append(
            ALICE_DIARY,
            [Message("user", "my secret plan"), Message("assistant", "noted")],
        )
    finally:
        storage.close()


def _session(project: Path, stored: str) -> list[str]:
    storage = open_storage(f"sqlite:///{project / 'state.db'}")
    try:
        return [str(m.content) for m in storage.sessions.load(stored)]
    finally:
        storage.close()


def test_http_without_a_valid_key_is_refused_before_anything_runs(project: Path) -> None:
    server = HttpServer(project)
    try:
        for headers in ({}, {"Authorization": "Bearer hk_0123456789abcdef.wrongwrongwrongwrong"}):
            reply = httpx.post(
                server.url,
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Accept": "application/json, text/event-stream", **headers},
                timeout=10,
            )
            assert reply.status_code == 401, reply.text
            assert "Authorization: Bearer" in reply.json()["detail"]
    finally:
        assert server.stop() == 0
    assert not (project / "ran.txt").exists()


def test_ask_over_http_cannot_name_another_users_session(project: Path) -> None:
    _seed_alice(project)
    bob = api_key(project, "bob")
    server = HttpServer(project)

    async def main() -> dict[str, object]:
        async with keyed_client(server.url, bob) as client:
            for session in ("diary", ALICE_DIARY):
                reply = await client.call_tool("ask", {"message": "read it", "session_id": session})
                assert reply.structured_content is not None
                assert reply.structured_content["session_id"] == session  # bob's own id
            return reply.structured_content

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        server.stop()
    assert _session(project, ALICE_DIARY) == ["my secret plan", "noted"]  # untouched
    assert _session(project, "bob:diary")[0] == "read it"
    assert _session(project, "bob:alice:diary")[0] == "read it"


def test_ask_over_stdio_runs_as_the_local_mcp_user(project: Path) -> None:
    _seed_alice(project)

    async def main() -> None:
        async with stdio_session(project) as client:
            reply = await client.call_tool("ask", {"message": "read it", "session_id": ALICE_DIARY})
            assert reply.structured_content is not None
            assert reply.structured_content["session_id"] == ALICE_DIARY

    asyncio.run(asyncio.wait_for(main(), 60))
    assert _session(project, ALICE_DIARY) == ["my secret plan", "noted"]
    assert _session(project, "mcp!local:alice:diary")[0] == "read it"


def test_a_non_loopback_host_without_auth_is_refused(project: Path) -> None:
    refused = subprocess.run(
        [
            sys.executable,
            *serve_args(project, "--transport", "http", "--host", "0.0.0.0", "--auth", "none"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "--auth keys" in refused.stderr and "0.0.0.0" in refused.stderr

    from hermes_agent.mcp.server import AgentMcpServer

    agent = Agent(model=ScriptedModel(["ok"]))
    server = AgentMcpServer(agent)
    try:
        with pytest.raises(ValueError, match="without API keys"):
            server.http_app(host="0.0.0.0")
        server.http_app(host="127.0.0.1")  # loopback without keys is the operator's choice
    finally:
        server.close()
        agent.close()


def test_http_with_auth_none_on_loopback_runs_as_the_local_user(project: Path) -> None:
    from mcp import Client

    server = HttpServer(project, "--auth", "none", "--user", "desk")

    async def main() -> None:
        async with Client(server.url, read_timeout_seconds=30) as client:
            reply = await client.call_tool("ask", {"message": "hi", "session_id": "s"})
            assert reply.structured_content is not None

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        server.stop()
    assert _session(project, "mcp!desk:s")[0] == "hi"


def test_the_mcp_server_only_narrows_the_operators_tools() -> None:
    """``--toolset`` cannot widen the operator's agent, and ``ask`` runs with the served
    toolsets only: a model asked through MCP cannot reach a tool the server does not list."""
    from mcp.types import CallToolRequestParams

    from hermes_agent.mcp.server import AgentMcpServer
    from hermes_agent.tools.registry import Tool

    wiped: list[str] = []

    def wipe_everything() -> str:
        """Wipe every account."""
        wiped.append("wiped")
        return "wiped"

    def lookup(term: str) -> str:
        """Look a term up."""
        return term

    call = '<tool_call>{"name": "wipe_everything", "arguments": {}}</tool_call>'
    agent = Agent(model=ScriptedModel([call, "tried"]), toolsets=["default"])
    agent.add_tool(Tool.from_function(wipe_everything, toolset="admin"))
    agent.add_tool(Tool.from_function(lookup))
    try:
        with pytest.raises(ValueError, match="'admin': not offered"):
            AgentMcpServer(agent, toolsets=["admin"])
        server = AgentMcpServer(agent, ask=True, toolsets=["default"])
        try:
            reply = asyncio.run(
                server.call_tool(
                    None,  # type: ignore[arg-type]
                    CallToolRequestParams(name="ask", arguments={"message": "please"}),
                )
            )
            assert reply.structured_content is not None, reply
            assert reply.structured_content["status"] == 200
        finally:
            server.close()
    finally:
        agent.close()
    assert wiped == []


def test_ask_is_a_run_of_the_backend_whose_approvals_the_policy_answers() -> None:
    """``ask`` starts a run on the server's run backend (readable there by its id, as any
    door's run) and answers the approvals the run asks for by the server's policy: a tool in
    ``approve`` runs, any other is denied; a direct call is admitted by the same backend."""
    from mcp import Client

    from hermes_agent import tool
    from hermes_agent.mcp.server import AgentMcpServer

    launched: list[str] = []

    @tool(requires_approval=True)
    def launch(target: str) -> str:
        """Launch something."""
        launched.append(target)
        return f"launched {target}"

    call = '<tool_call>{"name": "launch", "arguments": {"target": "moon"}}</tool_call>'
    for approve, expected in ((["launch"], True), ([], False)):
        agent = Agent(ScriptedModel([call, "done"]), tools=[launch])
        server = AgentMcpServer(agent, ask=True, approve=approve)

        async def main(server: AgentMcpServer = server) -> object:
            async with Client(server.lowlevel()) as client:
                reply = await client.call_tool("ask", {"message": "launch it"})
                assert reply.structured_content is not None, reply
                rid = str(reply.structured_content["request_id"])
                return await server.backend.view(rid, server.local_user)

        try:
            view = asyncio.run(asyncio.wait_for(main(), 60))
        finally:
            server.close()
            agent.close()
        assert view.status == "completed" and view.source == "memory"  # type: ignore[attr-defined]
        approvals = view.result["approvals"]  # type: ignore[attr-defined]
        assert [a["approved"] for a in approvals] == [expected], approvals
    assert launched == ["moon"]


def test_a_refused_session_is_answered_with_the_requests_own_id(project: Path) -> None:
    """Beyond ``max_sessions_per_user`` the door answers 429 before the SDK sees the request;
    its JSON-RPC error carries the request's id (JSON-RPC's ``null`` only where there is none
    to read)."""
    with (project / "config.yaml").open("a", encoding="utf-8") as config:
        config.write("service: {mcp: {max_sessions_per_user: 1}}\n")
    key = api_key(project, "mallory")
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {key}"}
    initialize = {
        "jsonrpc": "2.0",
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "greedy", "version": "1"},
        },
    }
    server = HttpServer(project)
    try:
        with httpx.Client(headers=headers, timeout=10) as client:
            first = client.post(server.url, json={**initialize, "id": 0})
            assert first.status_code == 200, first.text
            for request_id in ("open-2", 7, 0):
                refused = client.post(server.url, json={**initialize, "id": request_id})
                assert refused.status_code == 429, refused.text
                error = refused.json()
                assert error["id"] == request_id and error["jsonrpc"] == "2.0"
                assert "max_sessions_per_user" in error["error"]["message"]
            for body in (b"{not json", b'{"jsonrpc": "2.0", "method": "notifications/x"}'):
                refused = client.post(server.url, content=body)
                assert refused.status_code == 429 and refused.json()["id"] is None, refused.text
    finally:
        assert server.stop() == 0
