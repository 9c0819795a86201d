"""One thread keeps every lease of a worker (``worker.heartbeats.LeaseKeeper``): each held
lease is beaten every third of a lease, a beat the store stalls delays no other run's, a
lost lease stops its run, and a released lease is beaten no more.

A store stands in here (these are the keeper's rules); the durable fault tests hold the same
worker's leases against a real PostgreSQL that is stopped and reset."""

from __future__ import annotations

import threading
import time

import pytest

from hermes_agent.worker.attempt import Attempt
from hermes_agent.worker.heartbeats import LeaseKeeper
from server_harness import wait_for


class Store:
    def __init__(self) -> None:
        self.beats: dict[str, int] = {}
        self.stall: dict[str, threading.Event] = {}
        self.lost: set[str] = set()
        self.failing: set[str] = set()
        self.running: dict[str, int] = {}
        self.most_at_once: dict[str, int] = {}
        self.guard = threading.Lock()

    def heartbeat(self, request_id: str, token: int, lease_ttl: float) -> bool:
        with self.guard:
            self.running[request_id] = self.running.get(request_id, 0) + 1
            self.most_at_once[request_id] = max(
                self.most_at_once.get(request_id, 0), self.running[request_id]
            )
        try:
            if request_id in self.stall:
                self.stall[request_id].wait(10)
            if request_id in self.failing:
                raise ConnectionError("the store is away")
            with self.guard:
                self.beats[request_id] = self.beats.get(request_id, 0) + 1
            return request_id not in self.lost
        finally:
            with self.guard:
                self.running[request_id] -= 1


def attempt(store: Store, request_id: str, lease_ttl: float) -> Attempt:
    return Attempt(store, request_id, 1, lease_ttl)  # type: ignore[arg-type]


def lease_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("test-leases")]


@pytest.fixture
def store() -> Store:
    return Store()


def test_many_runs_share_one_keeper_thread_and_each_is_beaten(store: Store) -> None:
    keeper = LeaseKeeper(store, lease_ttl=0.3, name="test")
    try:
        attempts = [attempt(store, f"run-{i}", 0.3) for i in range(40)]
        held = [keeper.hold(a, lambda: None) for a in attempts]
        assert keeper.held() == 40
        wait_for(lambda: all(store.beats.get(a.request_id, 0) >= 3 for a in attempts))
        assert lease_threads() == ["test-leases"]
        before = {a.request_id: a.last_beat for a in attempts}
        wait_for(lambda: all(a.last_beat > before[a.request_id] for a in attempts))
        for h in held:
            keeper.release(h)
        assert keeper.held() == 0
        beaten = dict(store.beats)
        time.sleep(0.35)  # a spell past the beat interval, in which no beat may come
        assert store.beats == beaten  # released: no beat more
    finally:
        keeper.close()


def test_a_run_that_ends_before_its_first_beat_costs_the_store_nothing(store: Store) -> None:
    keeper = LeaseKeeper(store, lease_ttl=0.3, name="test")
    try:
        for i in range(200):
            keeper.release(keeper.hold(attempt(store, f"short-{i}", 0.3), lambda: None))
        time.sleep(0.35)  # a spell past the first beat's time, in which none may come
        assert store.beats == {}
        assert keeper.held() == 0
    finally:
        keeper.close()


def test_a_stalled_beat_delays_no_other_run_and_is_never_doubled(store: Store) -> None:
    keeper = LeaseKeeper(store, lease_ttl=0.3, name="test")
    store.stall["slow"] = threading.Event()
    try:
        slow = attempt(store, "slow", 0.3)
        fast = attempt(store, "fast", 0.3)
        keeper.hold(slow, lambda: None)
        keeper.hold(fast, lambda: None)
        wait_for(lambda: store.running.get("slow") == 1)
        wait_for(lambda: store.beats.get("fast", 0) >= 5)
        assert store.beats.get("slow", 0) == 0
        assert store.most_at_once["slow"] == 1
        last_beat_of_slow = slow.last_beat
        store.stall["slow"].set()
        wait_for(lambda: store.beats.get("slow", 0) >= 1)
        assert slow.last_beat > last_beat_of_slow
    finally:
        store.stall["slow"].set()
        keeper.close()


def test_a_lost_lease_stops_its_run_once_and_is_not_beaten_again(store: Store) -> None:
    keeper = LeaseKeeper(store, lease_ttl=0.3, name="test")
    stopped: list[str] = []
    try:
        store.lost.add("taken")
        taken = attempt(store, "taken", 0.3)
        keeper.hold(taken, lambda: stopped.append("taken"))
        kept = attempt(store, "kept", 0.3)
        keeper.hold(kept, lambda: stopped.append("kept"))
        wait_for(lambda: stopped == ["taken"])
        assert taken.lost and not kept.lost
        wait_for(lambda: store.beats.get("kept", 0) >= 4)
        assert store.beats["taken"] == 1
        assert stopped == ["taken"]
    finally:
        keeper.close()


def test_a_failed_beat_is_tried_again_and_does_not_count_as_one(store: Store) -> None:
    keeper = LeaseKeeper(store, lease_ttl=0.3, name="test")
    store.failing.add("away")
    try:
        away = attempt(store, "away", 0.3)
        first = away.last_beat
        keeper.hold(away, lambda: None)
        wait_for(lambda: store.most_at_once.get("away", 0) >= 1)
        time.sleep(0.35)  # a spell of failing beats: none counts as one, the run stays held
        assert away.last_beat == first and not away.lost
        store.failing.discard("away")
        wait_for(lambda: store.beats.get("away", 0) >= 1)
        assert away.last_beat > first
    finally:
        keeper.close()


def test_release_waits_for_a_beat_in_flight(store: Store) -> None:
    keeper = LeaseKeeper(store, lease_ttl=0.3, name="test")
    store.stall["ending"] = threading.Event()
    try:
        held = keeper.hold(attempt(store, "ending", 0.3), lambda: None)
        wait_for(lambda: store.running.get("ending") == 1)
        threading.Timer(0.2, store.stall["ending"].set).start()
        started = time.monotonic()
        keeper.release(held)
        assert time.monotonic() - started >= 0.15
        assert store.running["ending"] == 0 and store.beats["ending"] == 1
        time.sleep(0.35)  # a spell past the beat interval, in which no beat may come
        assert store.beats["ending"] == 1
    finally:
        store.stall["ending"].set()
        keeper.close()


def test_a_closed_keeper_holds_nothing_and_stops_its_thread(store: Store) -> None:
    keeper = LeaseKeeper(store, lease_ttl=0.3, name="test")
    keeper.hold(attempt(store, "left", 0.3), lambda: None)
    keeper.close()
    wait_for(lambda: lease_threads() == [])
    late = keeper.hold(attempt(store, "late", 0.3), lambda: None)
    keeper.release(late)
    time.sleep(0.35)  # a spell past the beat interval, in which no beat may come
    assert "late" not in store.beats and keeper.held() == 1
