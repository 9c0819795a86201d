"""Persistent state: sessions and the audit trail behind one seam (``Storage``), in SQL (SQLite
by default, PostgreSQL by URL) or in this process's memory (``InMemoryStorage``). A public module.

    from hermes_agent.storage import open_storage

    storage = open_storage("sqlite:///.hermes/state.db")   # or postgresql+psycopg://..., memory://
    storage.sessions      # conversations
    storage.audit         # where audit records go (written behind)
    storage.records(request_id), storage.requests()   # the trail, read back

The SQL backend (and SQLAlchemy) is imported only when first used. Replaying a recorded request
is behaviour, not storage: ``hermes_agent.replay``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hermes_agent.audit.records import parse_jsonl, records_to_jsonl
from hermes_agent.memory.session import SessionSummary
from hermes_agent.storage.base import (
    MAX_ID_LENGTH,
    AuditReader,
    RequestSummary,
    SessionIdError,
    Storage,
    StorageError,
    StoredSessions,
)
from hermes_agent.storage.in_memory import InMemoryStorage
from hermes_agent.storage.opening import open_storage
from hermes_agent.storage.writer import WriteBehindSink

if TYPE_CHECKING:
    from hermes_agent.storage.sql import (
        DEFAULT_URL,
        LATEST_VERSION,
        SqlAuditSink,
        SqlSessionStore,
        SqlStorage,
    )

_LAZY = {
    "DEFAULT_URL": "hermes_agent.storage.sql",
    "LATEST_VERSION": "hermes_agent.storage.sql",
    "SqlAuditSink": "hermes_agent.storage.sql",
    "SqlSessionStore": "hermes_agent.storage.sql",
    "SqlStorage": "hermes_agent.storage.sql",
}


def __getattr__(name: str) -> Any:
    # SQLAlchemy takes a third of a second to import; an agent without SQL storage never pays.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hermes_agent.storage' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEFAULT_URL",
    "LATEST_VERSION",
    "MAX_ID_LENGTH",
    "AuditReader",
    "InMemoryStorage",
    "RequestSummary",
    "SessionIdError",
    "SessionSummary",
    "SqlAuditSink",
    "SqlSessionStore",
    "SqlStorage",
    "Storage",
    "StorageError",
    "StoredSessions",
    "WriteBehindSink",
    "open_storage",
    "parse_jsonl",
    "records_to_jsonl",
]
