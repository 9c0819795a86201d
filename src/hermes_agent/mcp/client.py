"""Moved: MCP servers' tools are a tool source, in ``hermes_agent.tools.mcp.client``. This name
stays for one release so that existing imports keep working."""

from __future__ import annotations

from hermes_agent.tools.mcp.client import (
    BACKOFF_MAX,
    BACKOFF_START,
    CLOSE_TIMEOUT,
    MAX_TOOL_PAGES,
    PROBE_TIMEOUT,
    McpConnection,
    McpError,
    McpToolInfo,
    McpToolsets,
    bounded_result,
    describe,
    open_mcp_toolsets,
    require_sdk,
    tool_result,
)

__all__ = [
    "BACKOFF_MAX",
    "BACKOFF_START",
    "CLOSE_TIMEOUT",
    "MAX_TOOL_PAGES",
    "PROBE_TIMEOUT",
    "McpConnection",
    "McpError",
    "McpToolInfo",
    "McpToolsets",
    "bounded_result",
    "describe",
    "open_mcp_toolsets",
    "require_sdk",
    "tool_result",
]
