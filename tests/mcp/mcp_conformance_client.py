"""The agent's MCP client as the MCP conformance suite drives it (test_mcp_conformance.py).

    python tests/mcp/mcp_conformance_client.py URL

The suite starts a scenario's server, runs this program with the server's URL as its last
argument (the scenario's name in ``MCP_CONFORMANCE_SCENARIO``) and judges what reached the
server. The program does what an agent does with a configured MCP server (``mcp_servers:``):
it connects through ``open_mcp_toolsets``, lists the tools and calls each one once, with
arguments made from its input schema, as the ToolExecutor would; a server's request for input
goes to the agent's approver (here, one that approves). Nothing here is special to a
scenario: a scenario that needs more than that fails, and the baseline says why.

The server is configured with ``oauth:`` (the agent signs in when a server asks, ``oauth``),
with the client ID metadata document URL the suite knows and, where a scenario gives one in
``MCP_CONFORMANCE_CONTEXT``, its pre-registered client. Tokens are kept in a temporary state
folder. Where the agent would open the browser, this program fetches the authorization URL,
following redirects: the suite's authorization server approves at once and sends the browser
on to the agent's own loopback listener, which takes the code.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

SERVER = "conformance"
TIMEOUT_S = 30.0
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"
"""The client ID metadata document the suite's authorization servers accept."""


def example(schema: dict[str, Any]) -> Any:
    """A value valid for ``schema``: its default, first enum value or example, else a small
    value of its type (objects get their required properties)."""
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        required = schema.get("required") or []
        return {name: example(properties.get(name) or {}) for name in required}
    simple: dict[Any, Any] = {
        "integer": 1,
        "number": 1,
        "boolean": True,
        "array": [],
        "null": None,
    }
    return simple.get(kind, "tést")  # not ASCII: a header carrying it must be encoded


def approve(call: Any, tool: Any) -> tuple[bool, str]:
    """The agent's approver, as an operator who says yes to every request for input (the
    client answers with the defaults the server's form declares)."""
    return True, "approved by the operator"


def browse(url: str) -> None:
    """The user's browser: the authorization page approves at once, and its redirect lands on
    the agent's loopback listener."""
    import httpx2

    httpx2.get(url, follow_redirects=True, timeout=TIMEOUT_S).raise_for_status()


def oauth_settings() -> dict[str, Any]:
    """The ``oauth:`` block: the suite's client metadata document, and the pre-registered
    client a scenario gives in its context."""
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    # The suite's client gives up after 60 s: a sign-in that hangs fails before that.
    settings: dict[str, Any] = {"client_metadata_url": CLIENT_METADATA_URL, "sign_in_timeout": 15}
    if context.get("client_id"):
        settings["client_id"] = context["client_id"]
        settings["client_secret"] = context.get("client_secret")
    return settings


def main(url: str) -> int:
    from hermes_agent.config import McpOAuthConfig, McpServerConfig
    from hermes_agent.tools.mcp import OAuthSignIn, open_mcp_toolsets

    config = McpServerConfig(
        url=url,
        timeout=TIMEOUT_S,
        connect_timeout=TIMEOUT_S,
        oauth=McpOAuthConfig.model_validate(oauth_settings()),
    )
    with tempfile.TemporaryDirectory() as state:
        sign_in = OAuthSignIn(folder=Path(state), open_url=browse)
        return run(open_mcp_toolsets({SERVER: config}, approver=approve, sign_in=sign_in))


def run(toolsets: Any) -> int:
    """Call every tool once; 1 when a call failed."""
    failed = 0
    try:
        for tool in toolsets.tools:
            info = toolsets.info[tool.name]
            arguments = example(info.original_schema or tool.parameters)
            try:
                call = toolsets.call(SERVER, info.remote_name, arguments, TIMEOUT_S)
                result = toolsets.run(call, TIMEOUT_S + 5)
            except Exception as exc:  # a failed call is reported, the others still run
                failed += 1
                print(f"{info.remote_name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            else:
                print(f"{info.remote_name}: {result!r}")
    finally:
        toolsets.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1]))
