"""One attempt at a queued run: its fencing token, its hold on the lease, and how its writes
meet a store that fails.

Every write an attempt makes — journal, events, trail, the ending — goes through
``Attempt.write``:

    the write ──▶ done
       │ LeaseLost (the token is no longer the run's) ──▶ ``lost``: CancelledError, the run
       │                                                  stops and writes nothing more
       │ the store refused this write for good         ──▶ ``StoreRefused`` at once: the run
       │ (``transient`` says no: out of memory or disk,    ends ``failed`` with the reason, as
       │  a value too large, data it cannot take)          any stage's failure does
       │ the store was away (``transient``)             ──▶ again, with a growing pause, for at
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
import errno
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hermes_agent.audit.records import AuditRecord
from hermes_agent.errors import HermesAgentError, StoreUnavailable, is_store_error
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


class StoreRefused(HermesAgentError):
    """The store answered a write of a run with an error that trying again cannot mend: it ran
    out of memory or disk, the value is too large for it, or it refuses the data. Not an
    outage: the run ends ``failed`` with this message instead of going back to the queue to
    meet the same answer again (and a run whose ending cannot be stored either is left to its
    lease, and dead-lettered after ``max_redeliveries``)."""


def with_retries(
    write: Callable[..., T],
    *args: Any,
    budget: float,
    what: str,
    retry_if: Callable[[BaseException], bool] = is_store_error,
    **kwargs: Any,
) -> T:
    """``write(*args, **kwargs)``, again after a store failure that ``retry_if`` accepts
    (pauses from 50 ms doubling to 1 s) until ``budget`` seconds have passed; then
    ``StoreUnavailable``. Other errors (and ``LeaseLost``) go through at once. Every write
    retried this way is idempotent (an insert or replace, or fenced by a state it sets)."""
    deadline = time.monotonic() + budget
    pause = FIRST_PAUSE_S
    while True:
        try:
            return write(*args, **kwargs)
        except LeaseLost:
            raise
        except Exception as exc:
            if not (is_store_error(exc) and retry_if(exc)):
                raise
            if time.monotonic() + pause > deadline:
                raise StoreUnavailable(
                    f"the store did not take {what} within {budget:g} s: "
                    f"{type(exc).__name__}: {_first_line(exc)}"
                ) from exc
            logger.warning("%s: the store failed (%s); trying again", what, type(exc).__name__)
            time.sleep(pause)
            pause = min(MAX_PAUSE_S, pause * 2)


# What trying again may mend, when the database answered with a code: its connection failed
# (class 08), it is shutting down or starting (57P0x), a statement was cancelled or timed out
# (57014), a lock was not to be had (55P03), a conflict with another transaction (40001,
# 40P01), too many connections (53300). Any other code is the server refusing this statement.
_TRANSIENT_SQLSTATES = ("08", "57P", "57014", "55P03", "40001", "40P01", "53300")
_TRANSIENT_SQLITE = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR", "SQLITE_CANTOPEN")
# Said by a store (or its driver) that ran out of room for this write, whatever its class:
# an OperationalError such as "cannot allocate memory" is no outage, and the same write
# would only meet it again.
_EXHAUSTED = (
    "out of memory",
    "cannot allocate memory",
    "memory alloc",
    "could not extend file",
    "no space left on device",
    "disk is full",
    "too big",
    "too large",
)


def transient(exc: BaseException) -> bool:
    """Whether a store error says the store was away (a connection lost, refused, reset or
    timed out; a server restarting; a conflict or a lock worth waiting out) rather than that
    it refused the write itself (out of memory or disk, a value too large, bad data, a
    constraint): only the first is worth trying again."""
    import sqlalchemy.exc

    chain = _chain(exc)
    if any(_out_of_room(link) for link in chain):
        return False
    database = next((link for link in chain if isinstance(link, sqlalchemy.exc.DBAPIError)), None)
    if database is None:
        return is_store_error(exc)  # a pool timeout, a lost Redis connection, an outage
    # The driver's own words only: SQLAlchemy's text adds the statement and its values.
    if any(words in str(database.orig).lower() for words in _EXHAUSTED):
        return False
    code = getattr(database.orig, "sqlstate", None) or getattr(database.orig, "pgcode", None)
    if isinstance(code, str) and code:
        return code.startswith(_TRANSIENT_SQLSTATES)
    sqlite = getattr(database.orig, "sqlite_errorname", None)
    if isinstance(sqlite, str) and sqlite:
        return sqlite.startswith(_TRANSIENT_SQLITE)
    if isinstance(database, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        return True  # no code: the driver lost or could not open its connection
    return bool(database.connection_invalidated)


def _out_of_room(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOMEM, errno.ENOSPC)
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from (a few links, as ``errors.is_store_error`` reads)."""
    links: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(links) < 8:
        links.append(seen)
        seen = seen.__cause__
    return links


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
            return with_retries(
                write, *args, budget=self.budget, what=what, retry_if=transient, **kwargs
            )
        except LeaseLost:
            self.lost = True
            raise asyncio.CancelledError from None
        except StoreUnavailable as exc:
            self.give_up(exc)
            raise
        except Exception as exc:
            if not is_store_error(exc):
                raise
            # Refused for good. Not raised from the store's error: a store error under any
            # stage is taken for an outage (``StoreUnavailable``), and this is none.
            raise StoreRefused(
                f"the store refused {what}: {type(exc).__name__}: {_first_line(exc)}"
            ) from None
