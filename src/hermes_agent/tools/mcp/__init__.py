"""MCP servers as a tool source (the ``mcp`` extra; docs/mcp.md). A public module: import what
you need from here, not from ``client`` or ``schemas``.

- ``client``: an MCP server's tools as ordinary ``Tool``s, from the config's ``mcp_servers:``
  section (``build_agent`` wires them in); each call goes over the server's session, run on a
  loop thread of its own (``_loop``);
- ``schemas``: MCP input schemas made strict where that is safe;
- ``content`` and ``progress``: what a tool served over MCP returns beyond JSON (``Content``
  of text, ``Image``, ``Audio``, ``Resource``) and how it reports progress while it runs;
- ``oauth``: signing in to a server configured with ``oauth:`` (``OAuthSignIn``: where its
  tokens are kept, how the user is sent to the authorization page).

Serving an agent *as* an MCP server is a front door, not a tool source: ``hermes_agent.mcp``.
Importing this package imports nothing of the SDK; its modules import it where they use it.
"""

from hermes_agent.tools.mcp.client import McpToolsets, open_mcp_toolsets
from hermes_agent.tools.mcp.content import Audio, Content, Image, Resource
from hermes_agent.tools.mcp.oauth import OAuthSignIn
from hermes_agent.tools.mcp.progress import report_progress
from hermes_agent.tools.mcp.results import McpError
from hermes_agent.tools.mcp.schemas import is_strict, normalise

__all__ = [
    "Audio",
    "Content",
    "Image",
    "McpError",
    "McpToolsets",
    "OAuthSignIn",
    "Resource",
    "is_strict",
    "normalise",
    "open_mcp_toolsets",
    "report_progress",
]
