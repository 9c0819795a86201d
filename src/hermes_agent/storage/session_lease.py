"""One turn of a session at a time, across every process that shares the database.

A run holds its session from before it reads the history until its turn is appended. Inside one
process a ``threading.Lock`` per session does that; across processes (two services on one SQLite
file or one PostgreSQL, a service beside queue workers) a lease row in ``hermes_session_locks``
does: taken with one atomic upsert that succeeds only where no row is there or the row has
expired, renewed while the turn runs, deleted when it ends. A process killed while it holds a
session leaves a row that expires (``ttl``), so the session is not held for good.

A row, not a database lock: a SQLite write transaction held across a model call would stop
every other writer of the file, and a PostgreSQL advisory lock has no SQLite twin. Busy means
wait: the run polls (with backoff) until the row frees, and its own deadline (the service's
timeout cancels the wait) bounds how long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from sqlalchemy import Connection, Engine, delete, update
from sqlalchemy.exc import SQLAlchemyError

from hermes_agent.storage.base import StorageError
from hermes_agent.storage.schema import session_locks
from hermes_agent.storage.statements import dialect_insert

logger = logging.getLogger("hermes_agent")

LEASE_TTL_S = 30.0
"""How long a session's row holds without renewal: the longest a killed holder blocks it."""

_NO_ROOM = ("disk is full", "no space left on device", "could not extend file")
"""What a driver says when the store has no room for the lease row (SQLite's full disk,
PostgreSQL's 53100): the turn could not be saved either, so the run goes on held in this
process only, and says so."""

_FIRST_POLL_S = 0.005
_LAST_POLL_S = 0.2


class SessionLeases:
    """The lease rows of one database, and the thread that renews the ones this process holds.

    ``on_loop``: the database answers at once (a SQLite file), so a run may take and delete
    its row on the event loop, as it appends its turn there; otherwise (PostgreSQL, over the
    network) a run takes its row from a thread and the keeper thread deletes it."""

    def __init__(
        self,
        engine: Engine,
        connect: Callable[[], AbstractContextManager[Connection]],
        *,
        ttl: float = LEASE_TTL_S,
        on_loop: bool = True,
    ) -> None:
        self._connect = connect  # a connection for one statement that writes
        self.ttl = ttl
        self.on_loop = on_loop
        self._held: dict[str, str] = {}  # session → owner, while this process holds it
        self._releases: list[tuple[str, str, threading.Lock | None]] = []
        self._wake = threading.Condition()
        self._keeper: threading.Thread | None = None
        self._closed = False
        self._insert = dialect_insert(engine.dialect.name)

    # -- the rows ------------------------------------------------------------------------

    def take(self, session_id: str, owner: str) -> bool:
        """Write ``owner``'s row for ``session_id`` unless a live one is there; whether it did."""
        now = time.time_ns()
        expires = now + int(self.ttl * 1e9)
        statement = (
            self._insert(session_locks)
            .values(session_id=session_id, owner=owner, expires_ns=expires)
            .on_conflict_do_update(
                index_elements=[session_locks.c.session_id],
                set_={"owner": owner, "expires_ns": expires},
                where=session_locks.c.expires_ns < now,
            )
            .returning(session_locks.c.owner)  # no row: a live lease is there
        )
        with _failing("take the lock of session", session_id), self._connect() as conn:
            taken = conn.execute(statement).first() is not None
        if taken:
            with self._wake:
                self._held[session_id] = owner
                self._start_keeper()
        return taken

    def give_up(self, session_id: str, owner: str, local: threading.Lock | None) -> None:
        """Delete ``owner``'s row, then let the next run of this process have ``local``."""
        with self._wake:
            self._held.pop(session_id, None)
            if not self.on_loop and not self._closed:
                self._releases.append((session_id, owner, local))
                self._wake.notify()
                return
        self._delete(session_id, owner, local)

    def _delete(self, session_id: str, owner: str, local: threading.Lock | None) -> None:
        try:
            with self._connect() as conn:
                conn.execute(
                    delete(session_locks).where(
                        session_locks.c.session_id == session_id, session_locks.c.owner == owner
                    )
                )
        except SQLAlchemyError as exc:  # the row expires on its own
            logger.warning(
                "session %s: could not release its lock (it expires in %.0f s): %s",
                session_id[:80],
                self.ttl,
                exc,
            )
        finally:
            if local is not None:
                local.release()

    def _renew(self, held: dict[str, str]) -> None:
        expires = time.time_ns() + int(self.ttl * 1e9)
        for session_id, owner in held.items():
            try:
                with self._connect() as conn:
                    kept = conn.execute(
                        update(session_locks)
                        .where(
                            session_locks.c.session_id == session_id,
                            session_locks.c.owner == owner,
                        )
                        .values(expires_ns=expires)
                    ).rowcount
                if not kept:  # this process stalled past the ttl and another took the session
                    logger.warning("session %s: its lock expired during the turn", session_id[:80])
            except SQLAlchemyError as exc:
                logger.warning("session %s: could not renew its lock: %s", session_id[:80], exc)

    # -- the keeper ----------------------------------------------------------------------

    def _start_keeper(self) -> None:
        if self._keeper is None and not self._closed:
            self._keeper = threading.Thread(
                target=self._keep, name="hermes-session-leases", daemon=True
            )
            self._keeper.start()

    def _keep(self) -> None:
        next_renewal = time.monotonic() + self.ttl / 3
        while True:
            with self._wake:
                while not self._releases and not self._closed:
                    wait = next_renewal - time.monotonic()
                    if wait <= 0:
                        break
                    self._wake.wait(wait)
                releases, self._releases = self._releases, []
                closed = self._closed
                held = dict(self._held)
            for session_id, owner, local in releases:
                self._delete(session_id, owner, local)
            if closed:
                return
            if time.monotonic() >= next_renewal:
                self._renew(held)
                next_renewal = time.monotonic() + self.ttl / 3

    def close(self) -> None:
        """Stop renewing (rows still held expire); releases already asked for are made."""
        with self._wake:
            self._closed = True
            self._wake.notify()
            keeper = self._keeper
        if keeper is not None:
            keeper.join(timeout=5)


@contextlib.contextmanager
def _failing(what: str, session_id: str) -> Iterator[None]:
    """A store error while taking a lease, as the session store's ``StorageError``."""
    try:
        yield
    except SQLAlchemyError as exc:
        raise StorageError(f"cannot {what} {session_id[:80]!r}: {exc}") from exc


def _no_room(exc: StorageError) -> bool:
    cause = exc.__cause__
    driver = getattr(cause, "orig", cause)
    code = getattr(driver, "sqlstate", None) or getattr(driver, "pgcode", None)
    return code == "53100" or any(words in str(driver).lower() for words in _NO_ROOM)


async def _in_thread_until_held(take: Callable[[], bool], undo: Callable[[], object]) -> bool:
    """``take()`` in a thread; when the waiting run is cancelled meanwhile, what ``take``
    then got is undone as soon as it returns (else the session would stay held for good)."""
    attempt = asyncio.ensure_future(asyncio.to_thread(take))
    try:
        return await asyncio.shield(attempt)
    except asyncio.CancelledError:

        def undo_if_taken(done: asyncio.Future[bool]) -> None:
            if not done.cancelled() and done.exception() is None and done.result():
                undo()

        attempt.add_done_callback(undo_if_taken)
        raise


class SessionLease:
    """What ``SqlSessionStore.lock`` hands a run: the process's lock of the session, then its
    row. Used as a ``threading.Lock`` is (``acquire``, ``release``)."""

    def __init__(self, leases: SessionLeases | None, session_id: str) -> None:
        self._leases = leases
        self._session_id = session_id
        self._local = threading.Lock()
        self._owner: str | None = None  # this acquisition's row
        self.unheld: str | None = None
        """Why this acquisition holds the session in this process only (a full store), for the
        run's warnings; ``None`` while the row holds it everywhere."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._local.acquire(blocking, timeout):
            return False
        if self._leases is None:
            return True
        if not blocking and not self._leases.on_loop:
            # Called on the event loop: a round trip to the server is waited for from a
            # thread (the agent's ``acquire_elsewhere`` asks again, blocking, from one).
            self._local.release()
            return False
        deadline = None if timeout < 0 else time.monotonic() + timeout
        owner = uuid.uuid4().hex
        delay = _FIRST_POLL_S
        self.unheld = None
        try:
            while True:
                if self._take(self._leases, owner):
                    return True
                if not blocking or (deadline is not None and time.monotonic() + delay > deadline):
                    break
                time.sleep(delay)  # another process runs a turn of this session
                delay = min(delay * 2, _LAST_POLL_S)
        except BaseException:
            self._local.release()
            raise
        self._local.release()
        return False

    async def acquire_async(self) -> None:
        """``acquire``, for a run on an event loop: while another process holds the session
        the run polls from the loop, holding no thread — waiters parked in the loop's shared
        threads would starve the runs they wait for (their loads and appends go there too)."""
        if not self._local.acquire(blocking=False):
            await _in_thread_until_held(self._local.acquire, self._local.release)
        if self._leases is None:
            return
        leases = self._leases
        owner = uuid.uuid4().hex
        delay = _FIRST_POLL_S
        self.unheld = None
        try:
            while True:
                if leases.on_loop:
                    taken = self._take(leases, owner)
                else:
                    taken = await _in_thread_until_held(
                        lambda: self._take(leases, owner),
                        lambda: leases.give_up(self._session_id, owner, None),
                    )
                if taken:
                    return
                await asyncio.sleep(delay)  # another process runs a turn of this session
                delay = min(delay * 2, _LAST_POLL_S)
        except BaseException:
            self._local.release()
            raise

    def _take(self, leases: SessionLeases, owner: str) -> bool:
        """Take the row for ``owner``; a store with no room for it leaves the session held in
        this process only (``unheld`` says so), as a turn it cannot save is only a warning."""
        try:
            taken = leases.take(self._session_id, owner)
        except StorageError as exc:
            if not _no_room(exc):
                raise
            self.unheld = (
                f"storage: session {self._session_id[:80]!r} was held in this process only: "
                f"the store has no room for its lease ({exc})"
            )
            logger.error("%s", self.unheld)
            return True
        if taken:
            self._owner = owner
        return taken

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if self._leases is None or owner is None:
            self._local.release()
            return
        self._leases.give_up(self._session_id, owner, self._local)

    def locked(self) -> bool:
        return self._local.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
