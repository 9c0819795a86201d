"""Persistent state: sessions and the audit trail in SQL (SQLite by default, PostgreSQL by URL),
and replay of recorded requests.

    from hermes_agent.storage import SqlStorage

    storage = SqlStorage("sqlite:///.hermes/state.db")
    storage.sessions      # a SessionStore
    storage.audit         # an AuditSink (write-behind)
"""

from hermes_agent.storage.replay import ReplayReport, StepDiff, replay
from hermes_agent.storage.sql import (
    DEFAULT_URL,
    LATEST_VERSION,
    SqlAuditSink,
    SqlSessionStore,
    SqlStorage,
    StorageError,
    parse_jsonl,
)

__all__ = [
    "DEFAULT_URL",
    "LATEST_VERSION",
    "ReplayReport",
    "SqlAuditSink",
    "SqlSessionStore",
    "SqlStorage",
    "StepDiff",
    "StorageError",
    "parse_jsonl",
    "replay",
]
