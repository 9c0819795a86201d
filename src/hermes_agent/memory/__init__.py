"""Session memory: where conversations are kept and how much of them a prompt sees.

Implementation, not public API: import what you need from ``hermes_agent`` (docs/api.md).
"""
