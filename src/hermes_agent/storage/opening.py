"""Open the store a URL names. Apart from ``storage.base`` (the contract every store meets), so
that the contract imports none of its implementations."""

from __future__ import annotations

from hermes_agent.storage.base import Storage, StorageError


def open_storage(url: str) -> Storage:
    """The store a URL names: ``sqlite:///path.db``, ``sqlite://`` (in memory, SQL),
    ``postgresql+psycopg://user@host/db`` or ``memory://`` (``InMemoryStorage``)."""
    scheme = url.partition(":")[0].partition("+")[0].lower() if ":" in url else ""
    if scheme == "memory":
        from hermes_agent.storage.in_memory import InMemoryStorage

        return InMemoryStorage()
    if scheme in ("sqlite", "postgresql"):
        from hermes_agent.storage.sql import SqlStorage

        return SqlStorage(url)
    raise StorageError(
        f"storage url {url!r} names no known store; use sqlite:///.hermes/state.db, "
        "postgresql+psycopg://user@host/dbname or memory://"
    )
