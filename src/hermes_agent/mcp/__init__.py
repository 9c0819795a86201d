"""The Model Context Protocol, both ways (the ``mcp`` extra; docs/mcp.md).

- ``hermes_agent.mcp.client``: MCP servers' tools as ordinary ``Tool``s, from the config's
  ``mcp_servers:`` section (``build_agent`` wires them in);
- ``hermes_agent.mcp.server``: an agent's tools, and optionally the agent, as an MCP server
  (``hermes-agent mcp serve``);
- ``hermes_agent.mcp.schemas``: MCP input schemas made strict where that is safe.

Importing this package imports nothing of the SDK; its modules import it where they use it.
"""
