"""The agent's MCP client as the MCP conformance suite drives it (test_mcp_conformance.py).

    python tests/mcp/mcp_conformance_client.py URL

The suite starts a scenario's server, runs this program with the server's URL as its last
argument (the scenario's name in ``MCP_CONFORMANCE_SCENARIO``) and judges what reached the
server. The program does what an agent does with a configured MCP server (``mcp_servers:``):
it connects through ``open_mcp_toolsets``, lists the tools and calls each one once, with
arguments made from its input schema, as the ToolExecutor would; a server's request for input
goes to the agent's approver (here, one that approves). Nothing here is special to a
scenario: a scenario that needs more than that fails, and the baseline says why.
"""

from __future__ import annotations

import sys
from typing import Any

SERVER = "conformance"
TIMEOUT_S = 30.0


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


def main(url: str) -> int:
    from hermes_agent.config import McpServerConfig
    from hermes_agent.tools.mcp import open_mcp_toolsets

    config = McpServerConfig(url=url, timeout=TIMEOUT_S, connect_timeout=TIMEOUT_S)
    toolsets = open_mcp_toolsets({SERVER: config}, approver=approve)
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
