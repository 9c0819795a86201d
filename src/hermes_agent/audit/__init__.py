"""The audit trail: one record per stage per step, redacted, stored, exportable, replayable, and
read back per step (``audit.trace_view``: what the console and ``trace show`` display).

Implementation, not public API: import what you need from ``hermes_agent`` (docs/api.md).
Reading the trail back is ``hermes_agent.storage``; replaying it, ``hermes_agent.replay``.
"""
