"""MCP sessions over streamable HTTP are counted per user, as an attacker with one ordinary key
would try to exhaust them: on a real uvicorn on loopback, one key opens sessions as fast as it
can and holds at most ``max_sessions_per_user`` (429 beyond, with ``Retry-After``) while
another key is served; a session idle past ``session_idle_timeout_s`` is closed and stops
counting; a session id is no good to another key. Through ``hermes-agent mcp serve``'s app and
the service's ``mcp`` door alike."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from hermes_agent import Agent, ScriptedModel, tool
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.server import ServiceSettings, create_app
from server_harness import make_agent, serve, wait_for

pytest.importorskip("mcp")

from hermes_agent.mcp.server import AgentMcpServer

ACCEPT = {"Accept": "application/json, text/event-stream"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "attacker", "version": "1"},
    },
}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


@tool
def ping() -> str:
    """Answers pong."""
    return "pong"


def _headers(key: str, session: str | None = None) -> dict[str, str]:
    headers = {**ACCEPT, "Authorization": f"Bearer {key}"}
    if session is not None:
        headers["Mcp-Session-Id"] = session
    return headers


def _open(client: httpx.Client, key: str) -> httpx.Response:
    return client.post("/mcp", json=INITIALIZE, headers=_headers(key))


def _listed(client: httpx.Client, key: str, session: str) -> httpx.Response:
    return client.post("/mcp", json=LIST, headers=_headers(key, session))


@contextmanager
def _door(**limits: Any) -> Iterator[tuple[httpx.Client, MemoryKeyStore]]:
    keys = MemoryKeyStore()
    server = AgentMcpServer(Agent(ScriptedModel(["unused"]), tools=[ping]), keys=keys)
    try:
        app: Any = server.http_app(**limits)  # a Starlette app: serve() runs any ASGI app
        with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
            yield client, keys
    finally:
        server.close()


def test_one_key_holds_at_most_its_sessions_and_another_key_is_served() -> None:
    with _door(max_sessions_per_user=4) as (client, keys):
        mallory, bob = keys.create("mallory"), keys.create("bob")
        answers = [_open(client, mallory) for _ in range(40)]
        opened = [a.headers["mcp-session-id"] for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code != 200]
        assert len(opened) == 4, [a.status_code for a in answers]
        assert {a.status_code for a in refused} == {429}
        assert int(refused[0].headers["Retry-After"]) >= 1
        assert "max_sessions_per_user" in refused[0].json()["error"]["message"]
        # Another user is not affected, and mallory's own sessions still work.
        theirs = _open(client, bob)
        assert theirs.status_code == 200, theirs.text
        bobs = theirs.headers["mcp-session-id"]
        assert "ping" in _listed(client, bob, bobs).text
        assert "ping" in _listed(client, mallory, opened[0]).text
        # A session id is good for its own user only.
        assert _listed(client, mallory, bobs).status_code == 404
        assert _listed(client, bob, opened[0]).status_code == 404
        # Ending one makes room for one.
        ended = client.delete("/mcp", headers=_headers(mallory, opened[0]))
        assert ended.status_code < 400, ended.text
        assert _listed(client, mallory, opened[0]).status_code == 404
        assert _open(client, mallory).status_code == 200
        assert _open(client, mallory).status_code == 429


def test_an_idle_session_is_closed_and_stops_counting() -> None:
    with _door(max_sessions_per_user=2, session_idle_timeout_s=0.5) as (client, keys):
        mallory = keys.create("mallory")
        first = [_open(client, mallory) for _ in range(2)]
        assert [a.status_code for a in first] == [200, 200]
        assert _open(client, mallory).status_code == 429
        # Once idle past the timeout the SDK has closed them: room again, old ids unknown.
        wait_for(lambda: _open(client, mallory).status_code == 200, 10)
        for answer in first:
            assert _listed(client, mallory, answer.headers["mcp-session-id"]).status_code == 404


def test_the_service_door_counts_sessions_per_user_from_its_settings() -> None:
    keys = MemoryKeyStore()
    settings = ServiceSettings(keys_url="memory://", mcp={"max_sessions_per_user": 3})
    app = create_app(agent=make_agent("memory://"), settings=settings, keys=keys)
    mallory, bob = keys.create("mallory"), keys.create("bob")
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        statuses = [_open(client, mallory).status_code for _ in range(20)]
        assert statuses.count(200) == 3 and statuses.count(429) == 17, statuses
        assert _open(client, bob).status_code == 200
