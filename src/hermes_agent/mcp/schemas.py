"""Moved: MCP input schemas are normalised where MCP tools are made, in
``hermes_agent.tools.mcp.schemas``. This name stays for one release so that existing imports
keep working."""

from __future__ import annotations

from hermes_agent.tools.mcp.schemas import is_strict, normalise

__all__ = ["is_strict", "normalise"]
