"""OAuth for MCP servers over HTTP (``oauth:``): the config, its wiring, the sign-in on the
loopback listener, and the tokens kept per server.

The SDK's ``OAuthClientProvider`` runs the flow; here it signs requests of an httpx client whose
transport plays the MCP server and its authorization server, while the sign-in's answer goes
to the real loopback listener (the "browser" below requests it, as the authorization server's
redirect would). The conformance suite's ``auth/*`` scenarios check the flow itself against
the spec (test_mcp_conformance.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import stat
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("mcp")

import httpx2
from mcp.client.auth import OAuthFlowError
from pydantic import ValidationError

from hermes_agent.config import McpOAuthConfig, McpServerConfig
from hermes_agent.tools.mcp import OAuthSignIn
from hermes_agent.tools.mcp._oauth_flow import LoopbackCallback, oauth_provider

BASE = "http://127.0.0.1:9"
URL = f"{BASE}/mcp"
METADATA = "/.well-known/oauth-protected-resource/mcp"


class Servers:
    """The MCP server (``/mcp``, bearer tokens only) and its authorization server, as an
    httpx transport; what each was asked is in ``seen``."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.token_requests: list[httpx2.Request] = []
        self.valid = {"at-1", "at-2"}
        self.issued = 0

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        self.seen.append(f"{request.method} {path}")
        if path == "/mcp":
            if request.headers.get("authorization", "").removeprefix("Bearer ") in self.valid:
                return httpx2.Response(200, json={"ok": True})
            challenge = f'Bearer resource_metadata="{BASE}{METADATA}"'
            return httpx2.Response(401, headers={"WWW-Authenticate": challenge})
        if path == METADATA:
            return httpx2.Response(200, json={"resource": URL, "authorization_servers": [BASE]})
        if path == "/.well-known/oauth-authorization-server":
            return httpx2.Response(
                200,
                json={
                    "issuer": BASE,
                    "authorization_endpoint": f"{BASE}/authorize",
                    "token_endpoint": f"{BASE}/token",
                    "registration_endpoint": f"{BASE}/register",
                    "response_types_supported": ["code"],
                    "code_challenge_methods_supported": ["S256"],
                },
            )
        if path == "/register":
            body = json.loads(request.content)
            registered = {**body, "client_id": "dynamic-1", "token_endpoint_auth_method": "none"}
            return httpx2.Response(201, json=registered)
        if path == "/token":
            self.token_requests.append(request)
            form = parse_qs(request.content.decode())
            self.issued += 1
            token = "at-1" if form["grant_type"] == ["authorization_code"] else "at-2"
            return httpx2.Response(
                200,
                json={
                    "access_token": token,
                    "token_type": "Bearer",
                    "expires_in": 3600,
                    "refresh_token": "rt-1",
                },
            )
        return httpx2.Response(404)


class Browser:
    """The user's browser: the authorization server approves at once and redirects to the
    loopback ``redirect_uri`` with a code and the request's ``state``."""

    def __init__(self, state: str | None = None) -> None:
        self.opened: list[str] = []
        self.state = state  # a state of its own: a request the listener must not take
        self.answers: list[int] = []

    def __call__(self, url: str) -> None:
        self.opened.append(url)
        query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
        back = query["redirect_uri"]
        if self.state is not None:
            forged = httpx2.get(back, params={"code": "forged", "state": self.state})
            self.answers.append(forged.status_code)
        reply = httpx2.get(back, params={"code": "the-code", "state": query["state"], "iss": BASE})
        self.answers.append(reply.status_code)


async def get_mcp(servers: Servers, oauth: McpOAuthConfig, sign_in: OAuthSignIn) -> int:
    provider = oauth_provider("notes", URL, oauth, sign_in)
    transport = httpx2.MockTransport(servers)
    async with httpx2.AsyncClient(transport=transport, auth=provider) as client:
        return (await client.post(URL, json={})).status_code


def test_signs_in_once_and_keeps_the_tokens_in_a_private_file(tmp_path: Path) -> None:
    servers, browser = Servers(), Browser()
    sign_in = OAuthSignIn(folder=tmp_path / "oauth", open_url=browser)
    oauth = McpOAuthConfig()

    assert asyncio.run(get_mcp(servers, oauth, sign_in)) == 200
    assert len(browser.opened) == 1 and browser.answers == [200]
    kept = tmp_path / "oauth" / "notes.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    data = json.loads(kept.read_text())
    assert data["url"] == URL
    assert data["tokens"]["access_token"] == "at-1" and data["tokens"]["expires_at"] > 0
    assert data["client"]["client_id"] == "dynamic-1"

    # Another process, the same state folder: the kept token is used, no sign-in.
    servers.seen.clear()
    assert asyncio.run(get_mcp(servers, oauth, sign_in)) == 200
    assert servers.seen == ["POST /mcp"] and len(browser.opened) == 1

    # Expired since: refreshed with the kept refresh token, still no sign-in.
    data["tokens"]["expires_at"] = 1.0
    kept.write_text(json.dumps(data))
    servers.seen.clear()
    assert asyncio.run(get_mcp(servers, oauth, sign_in)) == 200
    assert servers.seen == ["POST /token", "POST /mcp"] and len(browser.opened) == 1
    assert json.loads(kept.read_text())["tokens"]["access_token"] == "at-2"


def test_without_a_folder_the_tokens_last_as_long_as_the_sign_in_object() -> None:
    servers, browser = Servers(), Browser()
    sign_in = OAuthSignIn(open_url=browser)  # a config from no file: in memory
    for _ in range(2):  # two sessions of one connection
        assert asyncio.run(get_mcp(servers, McpOAuthConfig(), sign_in)) == 200
    assert len(browser.opened) == 1
    assert sign_in.memory["notes"]["tokens"]["access_token"] == "at-1"


def test_the_kept_state_is_bound_to_the_servers_url(tmp_path: Path) -> None:
    servers, browser = Servers(), Browser()
    sign_in = OAuthSignIn(folder=tmp_path, open_url=browser)
    (tmp_path / "notes.json").write_text(
        json.dumps({"url": "http://elsewhere.test/mcp", "tokens": {"access_token": "at-1"}})
    )
    assert asyncio.run(get_mcp(servers, McpOAuthConfig(), sign_in)) == 200
    assert len(browser.opened) == 1  # the other URL's token was not sent here


def test_a_pre_registered_client_is_used_and_its_secret_never_written(tmp_path: Path) -> None:
    servers, browser = Servers(), Browser()
    sign_in = OAuthSignIn(folder=tmp_path, open_url=browser)
    oauth = McpOAuthConfig(client_id="hermes", client_secret="pre-secret")

    assert asyncio.run(get_mcp(servers, oauth, sign_in)) == 200
    assert "POST /register" not in servers.seen
    (token_request,) = servers.token_requests
    expected = base64.b64encode(b"hermes:pre-secret").decode()
    assert token_request.headers["authorization"] == f"Basic {expected}"
    assert "client_id=hermes" in browser.opened[0]
    assert "pre-secret" not in (tmp_path / "notes.json").read_text()


def test_the_listener_takes_only_the_answer_to_its_own_request(tmp_path: Path) -> None:
    browser = Browser(state="not-the-one-sent")
    sign_in = OAuthSignIn(folder=tmp_path, open_url=browser)
    assert asyncio.run(get_mcp(Servers(), McpOAuthConfig(), sign_in)) == 200
    assert browser.answers == [400, 200]  # the forged answer refused, the real one taken


def test_a_refusal_and_no_answer_end_the_sign_in() -> None:
    def refuse(url: str) -> None:
        state = parse_qs(urlsplit(url).query)["state"][0]
        httpx2.get(f"{redirect}?error=access_denied&state={state}")

    async def sign_in_once(open_url: Any, timeout: float) -> None:
        callback = LoopbackCallback("notes", redirect, OAuthSignIn(open_url=open_url), timeout)
        await callback.redirect(f"{BASE}/authorize?state=s1&redirect_uri={redirect}")
        await callback.answer()

    from hermes_agent.tools.mcp._oauth_flow import _free_redirect

    redirect = _free_redirect()
    with pytest.raises(OAuthFlowError, match="refused: access_denied"):
        asyncio.run(sign_in_once(refuse, 30))
    with pytest.raises(OAuthFlowError, match="within sign_in_timeout"):
        asyncio.run(sign_in_once(lambda url: None, 0.05))


def test_the_config_section_and_its_checks() -> None:
    server = McpServerConfig.model_validate({"url": URL, "oauth": True})
    assert server.oauth == McpOAuthConfig()
    assert server.connect_budget == server.connect_timeout + 300
    secret = McpServerConfig.model_validate(
        {"url": URL, "oauth": {"client_id": "a", "client_secret": "b"}}
    )
    assert "b" in secret.secrets()  # masked in the trail like a header's value
    wrong: list[dict[str, Any]] = [
        {"command": "x", "oauth": {}},
        {"url": URL, "oauth": {}, "headers": {"Authorization": "Bearer t"}},
        {"url": URL, "oauth": {"client_secret": "s"}},
        {"url": URL, "oauth": {"redirect_uri": "http://example.com:8080/cb"}},
        {"url": URL, "oauth": {"redirect_uri": "http://127.0.0.1/cb"}},
        {"url": URL, "oauth": {"client_metadata_url": "http://example.com/client.json"}},
        {"url": URL, "oauth": {"scopes": ["read"]}},
    ]
    for fields in wrong:
        with pytest.raises(ValidationError):
            McpServerConfig.model_validate(fields)


def test_a_config_file_keeps_its_tokens_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_agent import build_agent
    from hermes_agent.tools.mcp import client

    given: dict[str, Any] = {}

    class NoServers:
        tools: tuple[Any, ...] = ()

        def close(self) -> None: ...

    def opened(configs: Any, **options: Any) -> NoServers:
        given.update(configs=configs, **options)
        return NoServers()

    monkeypatch.setattr(client, "open_mcp_toolsets", opened)
    path = tmp_path / "agent.yaml"
    path.write_text(
        "model: {provider: scripted, model_name: none, responses: []}\n"
        "mcp_servers:\n"
        f"  notes: {{url: '{URL}', oauth: {{client_id: hermes}}}}\n"
    )
    build_agent(path).close()
    assert given["configs"]["notes"].oauth.client_id == "hermes"
    assert given["sign_in"].folder == tmp_path / ".hermes" / "mcp_oauth"
