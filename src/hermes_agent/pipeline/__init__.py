"""The run loop's stages, hooks, journal and renderers.

Implementation, not public API: import what you need from ``hermes_agent`` (docs/api.md).
"""
