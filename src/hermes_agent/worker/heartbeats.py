"""The heartbeats of a worker's runs: one thread keeps every lease the worker holds.

A run's lease is extended every third of ``lease_ttl`` while the run goes on. Most runs end
long before their first heartbeat is due, so a thread per run (started, and joined, for a
beat that never fires) was most of what holding a lease cost. Here one keeper thread holds a
heap of when each lease is next due; a lease that is due is beaten on a small pool of reused
threads, so that a beat the store stalls delays no other run's beat, and the next beat of
that run is due a third of ``lease_ttl`` after its beat returned (never two at once).

The keeper sleeps until the earliest beat is due and is woken only when it sleeps with
nothing to wait for: every lease is due ``lease_ttl / 3`` after it is taken, never earlier
than those already held. A run that ends leaves its entry in the heap, marked released, to
be dropped when it comes to the top (no wake of its own).

What a beat finds:

- the store extended the lease (from when it ran the beat, on its clock): the attempt notes
  when the beat was sent, never later than that (``Attempt.beat``: a tool call starts only
  while the latest beat is younger than a lease; one that came back late, from a store that
  paused, is followed by a fresh one before a call starts: ``worker.journal``);
- the lease is no longer this attempt's (taken over, or the run cancelled): the attempt is
  lost, ``on_lost`` stops the run, and no more beats are sent for it;
- the store failed: logged, and tried again a third of a lease later, until the lease runs
  out (the attempt then refuses to start tools, and its writes are fenced).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from hermes_agent.worker.attempt import Attempt

logger = logging.getLogger(__name__)


class Heartbeats(Protocol):
    """What the keeper needs of the run store (``worker.store.RunStore``)."""

    def heartbeat(self, request_id: str, token: int, lease_ttl: float) -> bool:
        """Extend the lease; ``False`` when it is no longer this token's."""
        ...


class HeldLease:
    """One attempt's lease, as long as the keeper holds it (``LeaseKeeper.hold``)."""

    __slots__ = ("attempt", "beating", "on_lost", "released")

    def __init__(self, attempt: Attempt, on_lost: Callable[[], None]) -> None:
        self.attempt = attempt
        self.on_lost = on_lost
        self.released = False
        self.beating = False


class LeaseKeeper:
    """Extends the leases of one worker's runs (see the module docstring)."""

    def __init__(
        self, store: Heartbeats, lease_ttl: float, *, beaters: int = 32, name: str = "hermes"
    ) -> None:
        self.store = store
        self.lease_ttl = lease_ttl
        self.interval = lease_ttl / 3
        self._name = name
        self._due: list[tuple[float, int, HeldLease]] = []
        self._order = itertools.count()  # equal times: first held, first beaten
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the keeper's own
        self._beaten = threading.Condition(self._lock)  # releases waiting for a beat
        self._sleeping = False
        self._closed = False
        self._holding = 0
        self._thread: threading.Thread | None = None
        # Threads are made only when none is idle: with runs shorter than a third of a
        # lease, none ever is; ``beaters`` bounds how many beats a stalled store holds.
        self._pool = ThreadPoolExecutor(max_workers=beaters, thread_name_prefix=f"{name}-beat")

    def hold(self, attempt: Attempt, on_lost: Callable[[], None]) -> HeldLease:
        """Keep ``attempt``'s lease from now until ``release``; ``on_lost`` is called (on a
        beating thread) when the lease turns out to be someone else's."""
        held = HeldLease(attempt, on_lost)
        with self._lock:
            if self._closed:  # the worker is stopping: this lease lapses (its writes are fenced)
                held.released = True
                return held
            self._schedule(held)
            self._holding += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._keep, name=f"{self._name}-leases", daemon=True
                )
                self._thread.start()
        return held

    def release(self, held: HeldLease, *, timeout: float = 5.0) -> None:
        """Stop beating ``held``; a beat already sent is waited for (at most ``timeout``),
        so that nothing is written for the attempt once this returns."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if not held.released:
                held.released = True
                self._holding -= 1
            while held.beating:
                left = deadline - time.monotonic()
                if left <= 0:
                    logger.warning(
                        "run %s: a heartbeat still waits for the store", held.attempt.request_id
                    )
                    return
                self._beaten.wait(left)

    def held(self) -> int:
        """How many leases are held now (for the tests and the logs)."""
        with self._lock:
            return self._holding

    def close(self) -> None:
        """Stop beating (the runs still held let their leases lapse)."""
        with self._lock:
            self._closed = True
            self._wake.notify()
        # Beats already handed to the pool still run (and end at once if released): one
        # cancelled here would leave its lease marked as beating for ``release`` to wait on.
        self._pool.shutdown(wait=False)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    # -- the keeper's thread and the beating threads ----------------------------------

    def _schedule(self, held: HeldLease) -> None:
        """(Holding the lock.) ``held`` is next due a third of a lease from now."""
        heapq.heappush(self._due, (time.monotonic() + self.interval, next(self._order), held))
        if self._sleeping:
            self._wake.notify()

    def _keep(self) -> None:
        while True:
            with self._lock:
                due = self._take_due()
                if due is None:
                    return
            for index, held in enumerate(due):
                try:
                    self._pool.submit(self._beat, held)
                except RuntimeError:  # the pool was shut down: the keeper is closing
                    with self._lock:
                        for unbeaten in due[index:]:
                            unbeaten.beating = False
                        self._beaten.notify_all()
                    return

    def _take_due(self) -> list[HeldLease] | None:
        """(Holding the lock.) Wait until some lease is due; ``None`` once closed."""
        while not self._closed:
            now = time.monotonic()
            due: list[HeldLease] = []
            while self._due and (self._due[0][2].released or self._due[0][0] <= now):
                _, _, held = heapq.heappop(self._due)
                if not held.released:
                    held.beating = True
                    due.append(held)
            if due:
                return due
            if self._due:
                self._wake.wait(self._due[0][0] - now)
            else:
                self._sleeping = True
                self._wake.wait()
                self._sleeping = False
        return None

    def _beat(self, held: HeldLease) -> None:
        attempt = held.attempt
        alive = True
        if not held.released:
            sent = time.monotonic()
            try:
                alive = self.store.heartbeat(attempt.request_id, attempt.token, self.lease_ttl)
            except Exception:  # the store is away: keep trying until the lease runs out
                logger.warning("run %s: heartbeat failed", attempt.request_id, exc_info=True)
            else:
                if alive:
                    attempt.beat(sent)
        if not alive:
            attempt.lost = True
            try:
                held.on_lost()
            except Exception:
                logger.exception("run %s: could not stop the run", attempt.request_id)
        with self._lock:
            held.beating = False
            self._beaten.notify_all()
            if alive and not held.released and not self._closed:
                self._schedule(held)
