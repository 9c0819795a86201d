"""The trail of queued runs: written by the attempt that holds the run, and ended once.

A worker's agent writes its audit records through ``AttemptTrail`` instead of the store's
write-behind queue. For a run an attempt of this process is running:

- its records join the attempt's batch, written with its next fenced transaction (a model
  turn's, its approval's or its ending's: ``RunStore.write_batch``), so a copy of the run that
  lost its lease — a frozen process resumed, a worker whose store stalled — adds nothing to
  the trail after the new owner, and a step's records land with its journal entries;
- the ``output`` record (the answer) is kept back and written with the run's ending, in the
  transaction that makes the run ``completed`` (``RunStore.finish``); a run that ends
  otherwise gets a ``stopped`` record there instead. So the trail has one ending, last, and
  it says what the run's row says;
- an attempt that gave up (its store failed, its lease is gone) writes nothing more: its
  unfinished step is left to the attempt that resumes the run, which records what is missing.

Records of anything else (none, in a worker) go to the store's own sink.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from hermes_agent.audit.records import AuditRecord, AuditSink, Role
from hermes_agent.worker.attempt import Attempt

logger = logging.getLogger("hermes_agent.worker")


class AttemptTrail:
    """An ``AuditSink`` that routes each run's records through the attempt running it."""

    def __init__(self, inner: AuditSink) -> None:
        self.inner = inner
        self._attempts: dict[str, Attempt] = {}
        self._guard = threading.Lock()

    def hold(self, attempt: Attempt) -> None:
        """Records of ``attempt.request_id`` go through ``attempt`` from now on."""
        with self._guard:
            self._attempts[attempt.request_id] = attempt

    def release(self, attempt: Attempt) -> None:
        with self._guard:
            if self._attempts.get(attempt.request_id) is attempt:
                del self._attempts[attempt.request_id]

    def write(self, records: Sequence[AuditRecord]) -> None:
        others: list[AuditRecord] = []
        by_run: dict[str, list[AuditRecord]] = {}
        with self._guard:
            for record in records:
                if record.request_id in self._attempts:
                    by_run.setdefault(record.request_id, []).append(record)
                else:
                    others.append(record)
            attempts = {rid: self._attempts[rid] for rid in by_run}
        for rid, held in by_run.items():
            attempt = attempts[rid]
            if not attempt.holds():
                continue  # the attempt that resumes the run records this step
            steps = [r for r in held if r.role != Role.OUTPUT.value]
            for record in held:
                if record.role == Role.OUTPUT.value:
                    attempt.output = record  # written with the ending
            if steps:
                # Written with the attempt's next transaction (its model turn, its approval
                # or its ending), so the trail and the journal of a step land together.
                attempt.add_records(steps)
        if others:
            self.inner.write(others)

    def flush(self) -> None:
        self.inner.flush()
