"""The storage seam: what a store holds and how it is opened.

A ``Storage`` is three things and a ``close``:

- ``sessions`` — conversations (``StoredSessions``: the agent's ``SessionStore`` plus listing
  and deleting);
- ``audit`` — where audit records go (an ``AuditSink``);
- the audit *reader* (``AuditReader``: ``records``, ``requests``, ``session_requests``,
  ``export_jsonl``) — what replay, the ``trace`` command and exports read.

``open_storage(url)`` picks the backend by the URL's scheme:

    open_storage("sqlite:///.hermes/state.db")           # SqlStorage, a SQLite file
    open_storage("postgresql+psycopg://user@host/db")    # SqlStorage on PostgreSQL
    open_storage("memory://")                            # InMemoryStorage, this process only

What every backend gets without writing it: the agent redacts secrets before a store sees a
record or a message (``audit.redaction``), so a new backend cannot keep a secret in clear, and
audit records arrive as text any store can hold; ``storage.writer.WriteBehindSink`` turns any
sink that stores a list of records in one transaction into a written-behind one that keeps whole
steps together and never lets one bad record lose the others. What a backend does itself: where
it encodes message text, pass it through ``audit.redaction.storable`` (a lone surrogate or NUL
becomes a ``\\uXXXX`` escape) if its encoding cannot hold every string. A new backend is one
module with a class that has the members below (and, for a URL scheme, one line in
``open_storage``).
"""

from __future__ import annotations

from typing import Protocol, TypedDict

from hermes_agent.audit.records import AuditRecord, AuditSink
from hermes_agent.audit.redaction import storable
from hermes_agent.errors import HermesAgentError
from hermes_agent.memory.session import SessionStore, SessionSummary

MAX_ID_LENGTH = 255
"""The longest session id the shipped stores hold (the SQL columns' width). The in-memory store
keeps the same limit, so code tested against it behaves the same on PostgreSQL."""


class StorageError(HermesAgentError):
    """The store cannot be opened, migrated, read or written as asked."""


class SessionIdError(StorageError):
    """A session id the store cannot hold (too long, or with characters no store can keep).
    Raised before a run starts, so nothing has happened yet."""


class RequestSummary(TypedDict):
    """One row of ``AuditReader.requests``."""

    request_id: str
    session_id: str
    started: str
    """ISO 8601, UTC."""
    duration_ms: float
    steps: int
    """Model turns."""
    status: str
    """Of the final output record: ok or error; ``stopped`` when a service stopped the run
    (``status_code`` says why: 409 cancelled, 504 timed out, 500 failed); ``incomplete``
    when the run never got there."""
    status_code: int
    model: str
    records: int


class StoredSessions(SessionStore, Protocol):
    """Conversations kept by a store: the agent's ``SessionStore`` (``load``, ``append`` — one
    turn, atomically —, ``lock``) plus what the ``sessions`` command needs."""

    def list_sessions(self, limit: int | None = None) -> list[SessionSummary]:
        """Sessions, most recently updated first."""
        ...

    def session_ids(self) -> list[str]:
        """Every session id, in no particular order."""
        ...

    def delete(self, session_id: str) -> bool:
        """Forget a session's messages; ``True`` when it existed. Its audit records stay (an
        audit trail is not the user's to edit)."""
        ...

    def create(self, session_id: str) -> None:
        """Make ``session_id`` a session with no message, where it is none yet: an id the
        service gives out before its run has saved a turn (a Responses id) exists from then."""
        ...

    def exists(self, session_id: str) -> bool:
        """Whether ``session_id`` is a session (made by ``create`` or a turn), empty or not."""
        ...


class AuditReader(Protocol):
    """What can be read back of the audit trail. Every read first waits for records written
    before it (a written-behind sink is flushed), so a run's records are there once it has
    returned."""

    def records(self, request_id: str) -> list[AuditRecord]:
        """Every record of one request, in the order they were made (``seq``)."""
        ...

    def requests(self, limit: int = 50) -> list[RequestSummary]:
        """The latest requests, newest first."""
        ...

    def session_requests(self, session_id: str) -> list[str]:
        """The request ids recorded for a session, oldest first."""
        ...

    def export_jsonl(self, request_id: str) -> str:
        """The records of one request as JSON Lines (``audit.records.records_to_jsonl``)."""
        ...


class Storage(AuditReader, Protocol):
    """Sessions, the audit trail and its reader, in one store (see the module docstring)."""

    @property
    def sessions(self) -> StoredSessions: ...

    @property
    def audit(self) -> AuditSink: ...

    @property
    def max_id_length(self) -> int:
        """The longest session id this store holds."""
        ...

    def close(self) -> None:
        """Store what is queued and release the store's resources (idempotent)."""
        ...


def check_session_id(session_id: str, max_length: int) -> None:
    """Refuse, with ``SessionIdError``, a session id a store cannot hold as given."""
    if not isinstance(session_id, str) or not session_id:
        raise SessionIdError(f"session id {session_id!r} must be a non-empty string")
    if len(session_id) > max_length:
        raise SessionIdError(
            f"session id is {len(session_id)} characters long; this store holds at most "
            f"{max_length}: use a shorter id (e.g. a hash of it)"
        )
    if storable(session_id)[1]:
        raise SessionIdError(
            f"session id {session_id!r} holds characters no store can keep (a lone surrogate "
            "or NUL); use plain text"
        )
