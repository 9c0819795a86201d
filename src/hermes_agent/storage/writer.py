"""Written-behind audit records, for any store.

``WriteBehindSink(target)`` is an ``AuditSink`` whose ``write`` queues the records of a step and
returns at once; a background thread hands what is queued to ``target`` — any sink that stores
the records it is given in one transaction and raises when it cannot. So a run never waits for
the database, a process killed at any moment leaves whole steps or nothing, and a store needs
to write only its one-transaction insert to get all of this.

When ``target`` refuses a burst, the steps in it are stored one by one (retried a few times: the
store may only have been busy), and a step that still fails is stored record by record, so only
the record at fault is lost — logged, counted in ``dropped`` and kept in ``quarantined`` — never
the records of other steps or other sessions that shared its transaction.
"""

from __future__ import annotations

import atexit
import collections
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from hermes_agent.audit.records import AuditRecord, AuditSink
from hermes_agent.storage.base import StorageError

logger = logging.getLogger("hermes_agent")

_STOP = object()
_HURRY = object()  # from flush(): store what is queued now


class WriteBehindSink:
    """An ``AuditSink`` that queues and returns; one background thread stores the queue
    through ``target`` (see the module docstring). ``flush`` waits until everything written so
    far is stored or set aside; it also runs at interpreter exit."""

    RETRIES = 3
    """Attempts at storing one step on its own before it is stored record by record."""
    LINGER_S = 0.02
    """Write once this long has passed with no new step (seen when the writer next wakes: its
    first linger is this long, each next one twice the last while steps keep coming, up to
    ``MAX_LINGER_S``)..."""
    MAX_LINGER_S = 0.08
    """...the longest linger, so that a burst is stored at most about this long after its steps
    stop (a run's ending among them)..."""
    MAX_DELAY_S = 0.5
    """...or once the oldest queued step has waited this long..."""
    MAX_RECORDS = 2000
    """...or once this many records are queued."""
    QUARANTINE = 100
    """How many refused records ``quarantined`` keeps (the latest)."""

    def __init__(self, target: AuditSink, *, name: str = "hermes-audit-writer") -> None:
        self.target = target
        self._name = name
        self._queue: queue.Queue[Any] = queue.Queue()
        self._last_queued = 0.0  # time.monotonic() of the latest write: has the stream paused?
        self._hurry = threading.Event()  # set by flush and close: the linger ends at once
        self._hurries = 0  # flushes whose _HURRY is not taken yet: the event is set while any
        self._hurry_guard = threading.Lock()
        self._thread: threading.Thread | None = None
        self._start_guard = threading.Lock()
        self._closed = False
        self.dropped = 0
        """Records that could not be stored (each step's losses also logged)."""
        self.quarantined: collections.deque[tuple[AuditRecord, str]] = collections.deque(
            maxlen=self.QUARANTINE
        )
        """The latest records the store refused, each with the error it gave."""
        self._exit_hook = _weak_flush(self)
        atexit.register(self._exit_hook)

    def write(self, records: Sequence[AuditRecord]) -> None:
        """Queue the records of one or more whole steps."""
        if not records:
            return
        if self._closed:
            raise StorageError("the audit sink is closed; records can no longer be written")
        self._ensure_thread()
        self._last_queued = time.monotonic()
        self._queue.put(list(records))

    def flush(self) -> None:
        """Return once every batch written so far is stored (or set aside)."""
        if self._thread is not None and self._thread.is_alive():
            # Counted and set before it is queued, so that the writer, which clears the event
            # once it has taken the last of them, never leaves it set with none queued.
            with self._hurry_guard:
                self._hurries += 1
                self._hurry.set()
            self._queue.put(_HURRY)
            self._queue.join()
        self.target.flush()

    def close(self) -> None:
        """Flush, then stop the writer thread."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._exit_hook)
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_STOP)
            self._hurry.set()
            self._thread.join()

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._start_guard:
            if self._thread is None or not self._thread.is_alive():
                # Daemon: a forgotten storage must not keep the process alive; the atexit
                # flush is what stores the tail of the queue.
                self._thread = threading.Thread(target=self._drain, name=self._name, daemon=True)
                self._thread.start()

    def _drain(self) -> None:
        while True:
            batches, stop = self._collect()
            try:
                steps = [b for b in batches if b is not _HURRY]
                if steps:
                    self._store(steps)
            except Exception:  # the writer must outlive any defect, or flush() waits forever
                logger.exception("audit: the writer failed")
            finally:
                for _ in range(len(batches) + (1 if stop else 0)):
                    self._queue.task_done()
            if stop:
                return

    def _collect(self) -> tuple[list[Any], bool]:
        """Wait for work, then keep taking batches while steps keep coming (up to a bound):
        one transaction per burst, written when the run pauses, keeps the writer off the GIL
        while steps run back to back. Still whole steps only; ``flush`` cuts the wait short.

        The linger is slept, not waited out on the queue: a thread waiting on the queue is
        woken by every step queued (a thread switch and a hand-over of the GIL each, and a
        service queues a step every few milliseconds); a sleeping one wakes once a linger,
        or at once for ``flush`` and ``close``. While steps keep coming each linger is twice
        the last, up to ``MAX_LINGER_S``: under steady load a fixed one woke the writer every
        ``LINGER_S`` only to see that more had come (25 wakes to a burst at the service's pace),
        where doubling wakes it eight times before ``MAX_DELAY_S`` ends the burst, which bounds
        how long a step waits either way. The burst is written at the first wake that finds no
        step queued in the last ``LINGER_S``, so a lone step is still stored one ``LINGER_S``
        after it came, and the steps before a pause (a run's ending) at most ``LINGER_S +
        MAX_LINGER_S`` after it began: a longer linger would hold them that much longer for a
        kill to lose."""
        item = self._queue.get()
        if item is _STOP or item is _HURRY:
            self._took(item)
            return ([], True) if item is _STOP else ([item], False)
        taken: list[Any] = [item]
        count = len(item)
        started = time.monotonic()
        lingered = False
        linger = self.LINGER_S
        while True:
            # What is queued already is taken at once (a backlog, say).
            while count < self.MAX_RECORDS:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP or item is _HURRY:
                    self._took(item)
                    return (taken, True) if item is _STOP else ([*taken, item], False)
                taken.append(item)
                count += len(item)
            now = time.monotonic()
            paused = lingered and now - self._last_queued >= self.LINGER_S
            full = count >= self.MAX_RECORDS  # written now, not after one more linger
            if full or paused or now - started >= self.MAX_DELAY_S:
                break
            if lingered:
                linger = min(linger * 2, max(self.MAX_LINGER_S, self.LINGER_S))
            self._hurry.wait(min(linger, self.MAX_DELAY_S - (now - started)))
            lingered = True
        return taken, False

    def _took(self, item: object) -> None:
        """The writer took a flush's ``_HURRY`` (or the ``_STOP`` of close, after which it
        ends): once no other flush waits, its linger may be slept again."""
        if item is _HURRY:
            with self._hurry_guard:
                self._hurries -= 1
                if self._hurries == 0:
                    self._hurry.clear()

    def _store(self, steps: list[list[AuditRecord]]) -> None:
        if self._try([record for step in steps for record in step]) is None:
            return  # the common case: the whole burst in one transaction
        for step in steps:
            error: Exception | None = None
            for attempt in range(self.RETRIES):
                if attempt:
                    time.sleep(0.05 * attempt)
                error = self._try(step)
                if error is None:
                    break
            if error is not None:
                self._isolate(step, error)

    def _isolate(self, step: list[AuditRecord], error: Exception) -> None:
        """Store a refused step record by record; set aside only the records refused alone."""
        lost = 0
        for record in step:
            refused = self._try([record])
            if refused is not None:
                lost += 1
                self.quarantined.append((record, f"{type(refused).__name__}: {refused}"))
        if lost:
            self.dropped += lost
            first = step[0]
            logger.error(
                "audit: %d of %d records of request %s (session %.64r, step %d) could not be "
                "stored and were set aside: %s",
                lost,
                len(step),
                first.request_id,
                first.session_id,
                first.step,
                error,
            )

    def _try(self, records: list[AuditRecord]) -> Exception | None:
        try:
            self.target.write(records)
        except Exception as exc:
            return exc
        return None


def _weak_flush(sink: WriteBehindSink) -> Callable[[], None]:
    # atexit must not keep every storage ever opened alive.
    ref = weakref.ref(sink)

    def flush() -> None:
        found = ref()
        if found is not None:
            found.flush()

    return flush
