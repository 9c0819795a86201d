"""What a queued run is in the store: its row (``QueuedRun``), a worker's claim on it
(``Claim``), the writes one attempt batches (``Batch``), the lease it can lose (``LeaseLost``)
and the statuses that end it; the request it keeps is a ``runs.request.QueuedRequest``. The
tables are in ``storage.schema``; the store that reads and writes them is
``worker.store.RunStore``."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Literal

from hermes_agent.audit.records import AuditRecord
from hermes_agent.runs.backend import RunView
from hermes_agent.runs.status import RunStatus as RunStatus  # a run's one status vocabulary
from hermes_agent.storage.base import StorageError

FINISHED = ("completed", "failed", "dead", "cancelled", "timed_out")

LIMITS_KEY = "limits"
"""The journal entry holding the run's limits as submitted (``run_timeout_s``)."""
DEADLINE_KEY = "deadline"
"""The journal entry holding the run's deadline (ns since the epoch), set by its first claim."""


class LeaseLost(StorageError):
    """This worker's hold on a run has passed to another (its lease expired and another worker
    took the run over): it must stop at once and write nothing more."""


@dataclass(slots=True)
class QueuedRun:
    """One row of ``hermes_runs``."""

    request_id: str
    session_id: str
    owner: str
    request: dict[str, Any]
    status: str
    created_ns: int
    updated_ns: int
    claims: int
    redeliveries: int
    lease_token: int
    lease_owner: str | None
    lease_expires_ns: int | None
    heartbeat_ns: int | None
    result: dict[str, Any] | None
    error: str | None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def view(self, session_id: str | None = None) -> RunView:
        """The run in the one shape every door shows (``runs.backend.RunView``), as the store
        knows it: ``session_id`` as its owner named it (the stored one by default); the
        approvals waiting are the service's to add."""
        return RunView(
            request_id=self.request_id,
            session_id=session_id if session_id is not None else self.session_id,
            status=self.status,
            source="queue",
            created=self.created_ns / 1e9,
            finished=self.updated_ns / 1e9 if self.finished else None,
            result=self.result,
            error=self.error,
            attempts=self.claims,
            redeliveries=self.redeliveries,
            worker=self.lease_owner,
        )


@dataclass(slots=True)
class Claim:
    """What a worker got when it asked for a run."""

    outcome: Literal["claimed", "finished", "parked", "busy", "dead", "waiting"]
    token: int = 0
    resumed: bool = False
    """A takeover or a resume: an earlier attempt of this run did some of its work."""
    heartbeat_ns: int | None = None
    """``busy``: the holder's latest heartbeat."""
    run: QueuedRun | None = None
    last_seq: int | None = None
    """``claimed``: the number of the run's latest event (the holder numbers the next ones);
    ``None`` when the claim did not read it."""
    timed: bool = True
    """``claimed``: whether the run may have a deadline (``False``: none was submitted, so
    the claim skips ``start_deadline``)."""
    history: bool = True
    """``claimed``: whether the run's session may hold messages (``False``: the claim saw it
    empty, so the run reads no history). Nothing else writes the session before the run's
    ending: the claim lets one run of a session go at a time."""


@dataclass(slots=True)
class Batch:
    """What one attempt has to write since its last fenced transaction: journal entries
    (key → state, payload), events numbered by the lease holder, and trail records. Written
    in one transaction (``RunStore.write_batch``, or with the run's ending or its approval)."""

    entries: dict[str, tuple[str, Any]] = dataclasses.field(default_factory=dict)
    events: list[tuple[int, dict[str, Any]]] = dataclasses.field(default_factory=list)
    records: list[AuditRecord] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.entries or self.events or self.records)


def now_ns() -> int:
    return time.time_ns()


def dumps(value: Any) -> str:
    """JSON for the store: non-JSON values become their ``str`` (as results do on the wire).
    ASCII with escapes, so that what a model or a tool wrote (a lone surrogate, a NUL) is kept
    exactly and never refused by the database's text encoding."""
    return json.dumps(value, ensure_ascii=True, default=str)


def queued_run(row: Any) -> QueuedRun:
    return QueuedRun(
        request_id=row.request_id,
        session_id=row.session_id,
        owner=row.owner,
        request=json.loads(row.request),
        status=row.status,
        created_ns=row.created_ns,
        updated_ns=row.updated_ns,
        claims=row.claims,
        redeliveries=row.redeliveries,
        lease_token=row.lease_token,
        lease_owner=row.lease_owner,
        lease_expires_ns=row.lease_expires_ns,
        heartbeat_ns=row.heartbeat_ns,
        result=json.loads(row.result) if row.result else None,
        error=row.error,
    )
