"""The session lease (``storage.session_lease``) on a real SQLite file and a real PostgreSQL
database: two stores opened on one database stand for two processes. A held session is refused
to the other store until released; a holder that died (stopped renewing) frees it at its ttl; a
live holder's renewals keep it past its ttl; a run cancelled while it waits leaves nothing held.
``tests/worker/test_session_turns_across_processes.py`` shows the same with two ``serve``
processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from hermes_agent.storage.session_lease import SessionLease, SessionLeases
from hermes_agent.storage.sql import SqlStorage
from storage_backends import sql_database_url  # noqa: F401  (the sql_url fixture)

TTL = 0.5


@pytest.fixture
def stores(sql_url: str) -> Iterator[tuple[SqlStorage, SqlStorage]]:
    first, second = SqlStorage(sql_url), SqlStorage(sql_url)
    yield first, second
    first.close()
    second.close()


def _leases(storage: SqlStorage, ttl: float = TTL) -> SessionLeases:
    return SessionLeases(
        storage.engine,
        lambda: storage.one_statement(write=True),
        ttl=ttl,
        on_loop=storage.engine.dialect.name == "sqlite",
    )


def test_a_session_held_in_one_process_waits_in_the_other(
    stores: tuple[SqlStorage, SqlStorage],
) -> None:
    one, other = stores
    held = one.sessions.lock("s")
    assert held.acquire(timeout=5)
    waiting = other.sessions.lock("s")
    assert not waiting.acquire(timeout=0.3)  # busy: waited, then gave up at its timeout
    assert other.sessions.lock("t").acquire(timeout=1)  # another session is not held
    held.release()
    assert waiting.acquire(timeout=5)
    waiting.release()


def test_a_holder_that_died_frees_the_session_at_its_ttl(
    stores: tuple[SqlStorage, SqlStorage],
) -> None:
    one, other = stores
    dead = _leases(one)
    assert SessionLease(dead, "s").acquire(timeout=5)
    dead.close()  # killed: no renewal, no release
    started = time.monotonic()
    live = _leases(other)
    try:
        taken = SessionLease(live, "s")
        assert taken.acquire(timeout=10)
        assert time.monotonic() - started > TTL / 2  # it waited for the row to expire
        taken.release()
    finally:
        live.close()


def test_a_live_holder_keeps_the_session_past_its_ttl(
    stores: tuple[SqlStorage, SqlStorage],
) -> None:
    one, other = stores
    holder, waiter = _leases(one), _leases(other)
    try:
        held = SessionLease(holder, "s")
        assert held.acquire(timeout=5)
        assert not SessionLease(waiter, "s").acquire(timeout=TTL * 3)  # renewed meanwhile
        held.release()
        assert SessionLease(waiter, "s").acquire(timeout=5)
    finally:
        holder.close()
        waiter.close()


def test_a_run_cancelled_while_it_waits_leaves_nothing_held(
    stores: tuple[SqlStorage, SqlStorage],
) -> None:
    one, other = stores

    async def scenario() -> None:
        held = one.sessions.lock("s")
        assert held.acquire(timeout=5)
        waiting = asyncio.create_task(other.sessions.lock("s").acquire_async())
        await asyncio.sleep(0.2)  # a spell in which the held lock must not be taken
        assert not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        held.release()
        again = other.sessions.lock("s")
        await asyncio.wait_for(again.acquire_async(), 5)  # neither lock nor row was left
        again.release()

    asyncio.run(scenario())
