"""Moved: the in-RAM store is ``hermes_agent.storage.in_memory`` (``memory`` is the
conversation history's name, ``hermes_agent.memory``). This name stays for one release so that
existing imports keep working; import ``InMemoryStorage`` from ``hermes_agent.storage``."""

from __future__ import annotations

from hermes_agent.storage.in_memory import InMemoryAuditLog, InMemoryStorage

__all__ = ["InMemoryAuditLog", "InMemoryStorage"]
