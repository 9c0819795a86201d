"""The audit trail: one record per stage per step, redacted, stored, exportable, replayable."""
