"""A worker notes a delivery in the store only when it waits for a slot (``DeliveryNotes``):
one that starts at once writes nothing, its claim notes it."""

from __future__ import annotations

import threading
import time

from hermes_agent.config import QueueConfig
from hermes_agent.worker.app import DeliveryNotes, delivery_delay
from server_harness import wait_for


class Notes:
    def __init__(self) -> None:
        self.noted: list[tuple[str, float]] = []
        self.seen = threading.Event()

    def __call__(self, request_id: str) -> None:
        self.noted.append((request_id, time.monotonic()))
        self.seen.set()


def test_a_delivery_that_starts_at_once_is_never_noted() -> None:
    notes = Notes()
    deliveries = DeliveryNotes(notes, delay=0.2)
    guard = deliveries._guard = CountedWakes()
    try:
        deliveries.received("r1")
        deliveries.started("r1")
        # Asleep with nothing pending: it looked again after r1's deadline.
        assert guard.asleep.wait(5)
        assert notes.noted == []
        assert deliveries.pending() == []
    finally:
        deliveries.close()


def test_a_delivery_that_waits_for_a_slot_is_noted_once_after_the_delay() -> None:
    notes = Notes()
    deliveries = DeliveryNotes(notes, delay=0.2)
    guard = deliveries._guard = CountedWakes()
    try:
        received = time.monotonic()
        deliveries.received("waits")
        deliveries.received("starts")
        deliveries.received("waits")  # a second receipt keeps the first deadline
        deliveries.started("starts")
        assert notes.seen.wait(5)
        assert guard.asleep.wait(5)  # past both deadlines, with nothing left to note
        assert [rid for rid, _ in notes.noted] == ["waits"]
        assert notes.noted[0][1] - received >= 0.2
        assert deliveries.pending() == []
        deliveries.started("waits")  # started after its note: nothing more
        time.sleep(0.3)  # a spell past the delay, in which no second note may come
        assert len(notes.noted) == 1
    finally:
        deliveries.close()


def test_a_note_the_store_refuses_does_not_stop_the_next() -> None:
    noted: list[str] = []
    refused = threading.Event()

    def note(request_id: str) -> None:
        if request_id == "bad":
            refused.set()
            raise RuntimeError("the store is away")
        noted.append(request_id)

    deliveries = DeliveryNotes(note, delay=0.05)
    try:
        deliveries.received("bad")
        assert refused.wait(5)
        deliveries.received("good")
        wait_for(lambda: noted, 5, "the good note")
        assert noted == ["good"]
    finally:
        deliveries.close()


def test_closed_notes_take_nothing_more() -> None:
    notes = Notes()
    deliveries = DeliveryNotes(notes, delay=0.05)
    deliveries.received("r1")
    deliveries.close()
    deliveries.received("r2")
    assert "r2" not in deliveries.pending()  # not taken: its thread, joined, notes nothing
    assert "r2" not in [rid for rid, _ in notes.noted]


def test_the_delay_is_a_tenth_of_a_lease_at_most_a_second() -> None:
    assert delivery_delay(QueueConfig(broker="redis://x", lease_ttl=5)) == 0.5
    assert delivery_delay(QueueConfig(broker="redis://x", lease_ttl=30)) == 1.0


class CountedWakes(threading.Condition):
    """The notes' own lock, counting how often its thread was woken."""

    def __init__(self) -> None:
        super().__init__()
        self.wakes = 0
        self.asleep = threading.Event()  # set while it waits with no deadline

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            self.asleep.set()
        woken = super().wait(timeout)
        self.asleep.clear()
        self.wakes += 1
        return woken


def test_deliveries_that_start_at_once_do_not_wake_the_thread_each_time() -> None:
    notes = Notes()
    deliveries = DeliveryNotes(notes, delay=0.2)
    counted = deliveries._guard = CountedWakes()
    try:
        for i in range(2000):
            deliveries.received(f"r{i}")
            deliveries.started(f"r{i}")
            if i % 100 == 0:
                time.sleep(0.01)  # a stream over about 0.2 s, as a busy worker sees one
        assert counted.asleep.wait(5)  # the thread looks again after the delay, then sleeps
        assert counted.wakes <= 10, counted.wakes
        assert notes.noted == []
        # Asleep with nothing to wait for, it is woken by the next delivery, and notes it
        # on time.
        received = time.monotonic()
        deliveries.received("after-a-quiet-spell")
        assert notes.seen.wait(5)
        assert [rid for rid, _ in notes.noted] == ["after-a-quiet-spell"]
        assert 0.2 <= notes.noted[0][1] - received < 1.0
    finally:
        deliveries.close()
