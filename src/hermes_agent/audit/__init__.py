"""The audit trail: one record per stage per step, redacted, stored, exportable, replayable, and
read back per step (``audit.trace_view``: what the console and ``trace show`` display)."""
