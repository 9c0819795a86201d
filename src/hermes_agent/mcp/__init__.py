"""The Model Context Protocol, both ways (the ``mcp`` extra; docs/mcp.md). A public module:
``AgentMcpServer``, ``approve_only``, ``ask_caller``, ``sample_caller``,
``list_caller_roots`` and ``CallerCannotAnswer`` are importable from here.

- ``hermes_agent.mcp.server``: an agent's tools, and optionally the agent, as an MCP server
  (``hermes-agent mcp serve``): a front door, through the run layer like the others;
- ``hermes_agent.mcp.asking``: a tool asks the MCP caller who called it for input
  (``ask_caller``), its model for a completion (``sample_caller``) or its roots
  (``list_caller_roots``), answered by requests to its client or, at 2026-07-28, an
  input-required result;
- MCP servers' tools as ordinary ``Tool``s are a tool source: ``hermes_agent.tools.mcp``.

Importing this package imports nothing of the SDK; its modules import it where they use it.
"""

from hermes_agent.mcp.asking import (
    CallerCannotAnswer,
    ask_caller,
    list_caller_roots,
    sample_caller,
)
from hermes_agent.mcp.server import AgentMcpServer, approve_only

__all__ = [
    "AgentMcpServer",
    "CallerCannotAnswer",
    "approve_only",
    "ask_caller",
    "list_caller_roots",
    "sample_caller",
]
