"""A queued run's session is read by its delivery's thread before the run starts, so that the
run's own load on the worker's shared event loop does not wait for the store there."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy.exc

from hermes_agent.errors import StoreUnavailable
from hermes_agent.worker.runner import _StoreSessions


class Sessions:
    """A session store that counts its reads, and in which thread each happened."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, str]] = []
        self.fail = False
        self.turns: dict[str, list[str]] = {"s1": ["hello"]}

    def load(self, session_id: str) -> Any:
        self.reads.append((session_id, threading.current_thread().name))
        if self.fail:
            raise sqlalchemy.exc.OperationalError("SELECT", {}, Exception("connection refused"))
        return list(self.turns.get(session_id, []))

    def lock(self, session_id: str) -> str:
        return f"lock {session_id}"


def test_the_runs_load_finds_the_session_its_delivery_read() -> None:
    inner = Sessions()
    sessions = _StoreSessions(inner)
    reader = threading.Thread(target=sessions.preload, args=("s1",), name="delivery")
    reader.start()
    reader.join()
    assert sessions.load("s1") == ["hello"]
    assert inner.reads == [("s1", "delivery")]  # read once, by the delivery's thread
    # Read once: the next load (the next run of the session) reads the store again.
    inner.turns["s1"].append("again")
    assert sessions.load("s1") == ["hello", "again"]
    assert len(inner.reads) == 2


def test_a_preload_the_store_fails_fails_the_runs_load_as_the_store_failing() -> None:
    inner = Sessions()
    inner.fail = True
    sessions = _StoreSessions(inner)
    sessions.preload("s1")  # the failure is kept for the run, not raised in the delivery
    with pytest.raises(StoreUnavailable):
        sessions.load("s1")
    assert len(inner.reads) == 1


def test_a_run_that_ended_before_its_load_leaves_nothing_behind() -> None:
    inner = Sessions()
    sessions = _StoreSessions(inner)
    sessions.preload("s1")
    sessions.forget("s1")
    inner.turns["s1"] = ["changed"]
    assert sessions.load("s1") == ["changed"]  # read afresh, not the forgotten copy


def test_other_session_calls_go_to_the_store() -> None:
    sessions = _StoreSessions(Sessions())
    # The claim is a queued run's session lock: the store's (a lease row) is not taken.
    assert sessions.lock("s2").acquire(blocking=False)
    assert sessions.load("unknown") == []
