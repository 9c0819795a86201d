"""Tools: the registry, schemas, argument validation, the sandbox.

Implementation, not public API: import what you need from ``hermes_agent`` (docs/api.md). The
exception is ``hermes_agent.tools.mcp``, a public module.
"""
