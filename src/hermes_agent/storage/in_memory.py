"""Sessions and the audit trail in this process's memory (``memory://``): the ``Storage`` seam
with nothing behind it, for tests, notebooks and replays.

    storage = InMemoryStorage()
    agent = Agent(model=ScriptedModel(["hi"]), storage=storage)
    result = agent.run("hello", session_id="s1")
    storage.records(result.request_id)      # the run's audit records
    storage.sessions.load("s1")             # its conversation

It passes the same storage tests as the SQL backend, and keeps the same limits (session ids of
at most ``MAX_ID_LENGTH`` characters), so what works against it works against PostgreSQL.
Records are stored as they are written (there is no database to wait for); they live as long
as the object does.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime

from hermes_agent.audit.records import AuditRecord, AuditSink, Role, records_to_jsonl
from hermes_agent.memory.session import InMemorySessionStore
from hermes_agent.storage.base import MAX_ID_LENGTH, RequestSummary, StorageError


class InMemoryAuditLog:
    """The audit trail as a list: an ``AuditSink`` that stores on ``write`` (all records of a
    call together, under one lock, so a reader never sees half a step)."""

    def __init__(self) -> None:
        self._records: list[AuditRecord] = []
        self._guard = threading.Lock()
        self._closed = False

    def write(self, records: Sequence[AuditRecord]) -> None:
        if self._closed:
            raise StorageError("the audit sink is closed; records can no longer be written")
        with self._guard:
            self._records.extend(records)

    def flush(self) -> None:
        """Nothing is ever queued."""

    def close(self) -> None:
        self._closed = True

    def snapshot(self) -> list[AuditRecord]:
        """Every record stored so far, in the order written."""
        with self._guard:
            return list(self._records)


class InMemoryStorage:
    """The ``Storage`` seam in memory: ``sessions``, ``audit`` and the audit reader."""

    max_id_length = MAX_ID_LENGTH

    def __init__(self) -> None:
        self._sessions = InMemorySessionStore()
        self._audit = InMemoryAuditLog()

    @property
    def sessions(self) -> InMemorySessionStore:
        return self._sessions

    @property
    def audit(self) -> AuditSink:
        return self._audit

    def records(self, request_id: str) -> list[AuditRecord]:
        found = [r for r in self._audit.snapshot() if r.request_id == request_id]
        return sorted(found, key=lambda r: r.seq)  # stable: equal seqs keep their order

    def requests(self, limit: int = 50) -> list[RequestSummary]:
        grouped: dict[str, list[AuditRecord]] = {}
        for record in self._audit.snapshot():
            grouped.setdefault(record.request_id, []).append(record)
        ordered = sorted(
            grouped.items(), key=lambda item: (-min(r.timestamp_ns for r in item[1]), item[0])
        )
        return [_summary(request_id, records) for request_id, records in ordered[:limit]]

    def session_requests(self, session_id: str) -> list[str]:
        first: dict[str, int] = {}
        for record in self._audit.snapshot():
            if record.session_id == session_id:
                seen = first.get(record.request_id)
                if seen is None or record.timestamp_ns < seen:
                    first[record.request_id] = record.timestamp_ns
        return sorted(first, key=lambda request_id: (first[request_id], request_id))

    def export_jsonl(self, request_id: str) -> str:
        return records_to_jsonl(self.records(request_id))

    def close(self) -> None:
        self._audit.close()

    def __enter__(self) -> InMemoryStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "InMemoryStorage()"


def _summary(request_id: str, records: list[AuditRecord]) -> RequestSummary:
    started = min(r.timestamp_ns for r in records)
    ended = max(r.timestamp_ns for r in records)
    final = next((r for r in records if r.role == Role.OUTPUT), None)
    stopped = next((r for r in records if r.role == Role.STOPPED), None)
    return RequestSummary(
        request_id=request_id,
        session_id=min(r.session_id for r in records),
        started=datetime.fromtimestamp(started / 1e9, tz=UTC).isoformat(timespec="milliseconds"),
        duration_ms=round((ended - started) / 1e6, 3),
        steps=sum(1 for r in records if r.role == Role.COMPLETION),
        status=final.status if final else "stopped" if stopped else "incomplete",
        status_code=final.status_code if final else stopped.status_code if stopped else 0,
        model=max(r.model_name for r in records),
        records=len(records),
    )
