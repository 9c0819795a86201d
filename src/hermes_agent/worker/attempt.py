"""One attempt at a queued run: its fencing token, its hold on the lease, and how its writes
meet a store that fails.

Every write an attempt makes — journal, events, trail, the ending — goes through
``Attempt.write``:

    the write ──▶ done
       │ LeaseLost (the token is no longer the run's) ──▶ ``lost``: CancelledError, the run
       │                                                  stops and writes nothing more
       │ the store failed (``errors.is_store_error``) ──▶ again, with a growing pause, for at
       │                                                  most ``retry_budget`` seconds
       ▼ still failing
    ``broken``: StoreUnavailable — the attempt ends without an ending; the worker gives the
    delivery back to the broker and the run resumes from its journal when the store is back

and every tool call asks ``check_lease`` right before it starts: an attempt whose last
successful heartbeat is ``lease_ttl`` old (or older) may have lost its lease without knowing
it (a frozen process, a stalled store), so it starts nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hermes_agent.audit.records import AuditRecord
from hermes_agent.errors import StoreUnavailable, is_store_error
from hermes_agent.types import Message
from hermes_agent.worker.store import Batch, LeaseLost, RunStore

logger = logging.getLogger("hermes_agent.worker")

T = TypeVar("T")

FIRST_PAUSE_S = 0.05
MAX_PAUSE_S = 1.0


def retry_budget(lease_ttl: float) -> float:
    """How long one write keeps trying: half a lease (at least half a second, at most ten),
    so that an attempt gives up while its lease may still be its own."""
    return min(10.0, max(0.5, lease_ttl / 2))


def with_retries(write: Callable[..., T], *args: Any, budget: float, what: str, **kwargs: Any) -> T:
    """``write(*args, **kwargs)``, again after a store failure (pauses from 50 ms doubling to
    1 s) until ``budget`` seconds have passed; then ``StoreUnavailable``. Other errors (and
    ``LeaseLost``) go through at once. Every write retried this way is idempotent (an insert
    or replace, or fenced by a state it sets)."""
    deadline = time.monotonic() + budget
    pause = FIRST_PAUSE_S
    while True:
        try:
            return write(*args, **kwargs)
        except LeaseLost:
            raise
        except Exception as exc:
            if not is_store_error(exc):
                raise
            if time.monotonic() + pause > deadline:
                raise StoreUnavailable(
                    f"the store did not take {what} within {budget:g} s: "
                    f"{type(exc).__name__}: {_first_line(exc)}"
                ) from exc
            logger.warning("%s: the store failed (%s); trying again", what, type(exc).__name__)
            time.sleep(pause)
            pause = min(MAX_PAUSE_S, pause * 2)


def transient(exc: BaseException) -> bool:
    """Whether a store error says the store was away (a connection lost, refused, reset or
    timed out) rather than that it refused the write itself (a constraint, bad data)."""
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        return True
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        return bool(exc.connection_invalidated)
    return is_store_error(exc)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


@dataclass
class Attempt:
    """The state of one attempt (one claim, one token) of one run."""

    store: RunStore
    request_id: str
    token: int
    lease_ttl: float
    session_id: str = ""
    last_beat: float = field(default_factory=time.monotonic)
    """When the latest heartbeat that reached the store was sent (``time.monotonic``)."""
    lost: bool = False
    """The lease passed to another attempt (or the run was cancelled)."""
    broken: StoreUnavailable | None = None
    """Why this attempt gave up on the store; it writes nothing more."""
    output: AuditRecord | None = None
    """The trail's ``output`` record, kept back until the run's ending is written with it."""
    turn: list[Message] | None = None
    """The session turn, kept back until the run's ending is written with it."""
    last_seq: int = 0
    """The number of the latest event of the run this attempt knows of: the attempt numbers
    its own events after it (it holds the run, so nobody else adds one meanwhile but a
    cancellation, which fences it out)."""
    batch: Batch = field(default_factory=Batch)
    """What the attempt has yet to write: the journal's entries, events and trail records
    since its last fenced transaction (one per model turn; ``take``)."""
    handed_over: bool = False
    """The ending named the session's next run (or that none waits): no hand-over read."""
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def add_event(self, wire: dict[str, Any]) -> None:
        """Number an event of the run and keep it for the attempt's next transaction."""
        with self._guard:
            self.last_seq += 1
            self.batch.events.append((self.last_seq, wire))

    def add_records(self, records: list[AuditRecord]) -> None:
        with self._guard:
            self.batch.records.extend(records)

    def add_entry(self, key: str, state: str, payload: Any) -> None:
        with self._guard:
            self.batch.entries[key] = (state, payload)

    def take(self) -> Batch:
        """What is pending, for one transaction (the attempt starts a new batch)."""
        with self._guard:
            taken, self.batch = self.batch, Batch()
        return taken

    @property
    def budget(self) -> float:
        return retry_budget(self.lease_ttl)

    def holds(self) -> bool:
        """Whether this attempt may still write: it has not lost the run nor given up."""
        return not self.lost and self.broken is None

    def beat(self, sent: float) -> None:
        """A heartbeat sent at ``sent`` reached the store and extended the lease."""
        with self._guard:
            self.last_beat = max(self.last_beat, sent)

    def alive(self) -> None:
        """Raise unless the attempt may go on: ``CancelledError`` once the run is lost,
        ``StoreUnavailable`` once the attempt gave up on the store."""
        if self.lost:
            raise asyncio.CancelledError
        if self.broken is not None:
            raise self.broken

    def check_lease(self, what: str) -> None:
        """Right before ``what`` (a tool call) starts: refuse unless a heartbeat reached the
        store less than ``lease_ttl`` ago (so the lease is still this attempt's)."""
        self.alive()
        silent = time.monotonic() - self.last_beat
        if silent >= self.lease_ttl:
            self.give_up(
                StoreUnavailable(
                    f"run {self.request_id}: no heartbeat reached the store for {silent:.1f} s "
                    f"(lease_ttl {self.lease_ttl:g} s), so this attempt may have lost its "
                    f"lease; {what} was not started"
                )
            )
            self.alive()

    def give_up(self, reason: StoreUnavailable) -> None:
        if self.broken is None:
            self.broken = reason
            logger.warning("run %s: attempt %d stops: %s", self.request_id, self.token, reason)

    def write(self, what: str, write: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One fenced write of this attempt (see the module docstring)."""
        self.alive()
        try:
            return with_retries(write, *args, budget=self.budget, what=what, **kwargs)
        except LeaseLost:
            self.lost = True
            raise asyncio.CancelledError from None
        except StoreUnavailable as exc:
            self.give_up(exc)
            raise
