"""The records the service itself keeps of its in-process runs, beside the agent's trail.

- **accepted**: the first record of a run, written to the store before anything of the run
  happens (before the session is read, before the first model call) and before its id goes out
  to any client, so ``GET /v1/runs/{id}`` answers for every id the service ever gave out — even
  after the process is killed. It names the instance (``ServiceSettings.instance``), the process
  and this process's boot, and is numbered ``seq`` -1: the run's own records count from 0 as
  every trail does.
- **interrupted**: on start, the instance ends the runs its earlier life left without an ending
  (a ``stopped`` record, status ``interrupted``, code 503), so no trail it began stays open.
  Only its own: another instance on the same store ends its runs when it starts; a process
  still alive is left alone.
- **lost records**: a store that cannot be written (a full disk) does not fail a run that has
  had its effects, but its warnings say what was lost: the session turn (the agent says so),
  the first record, the records of the trail.

``StoreProbe`` is what ``/readyz`` asks: can the store be written now?
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from hermes_agent.agent import Agent
from hermes_agent.audit.recorder import lifecycle_record
from hermes_agent.audit.records import AuditRecord, AuditSink, Role
from hermes_agent.memory.session import AnswersAtOnce
from hermes_agent.storage.base import Storage
from hermes_agent.storage.in_memory import InMemoryStorage
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.storage.writer import WriteBehindSink
from hermes_agent.types import Message

logger = logging.getLogger("hermes_agent.server")

BOOT = uuid.uuid4().hex
"""This process's life: an accepted record of another boot was written before this start."""

RECOVERY_SCAN = 2000
"""How many of the newest trails the start looks through for runs left without an ending (a
killed process leaves at most its runs in flight, and they are the newest it wrote)."""

INTERRUPTED = "the service stopped (killed or crashed) while the run was in flight"


def direct_sink(storage: Storage) -> AuditSink:
    """The store's own one-transaction sink, under any write-behind queue: a record written
    through it is stored (or the write raises) before ``write`` returns."""
    sink = storage.audit
    return sink.target if isinstance(sink, WriteBehindSink) else sink


def accepted_record(agent: Agent, request_id: str, session_id: str, instance: str) -> AuditRecord:
    """The first record of a run (see the module docstring)."""
    record = lifecycle_record(
        [],
        request_id=request_id,
        session_id=session_id,
        stage="RunManager",
        role=Role.ACCEPTED,
        content={"status": "running", "instance": instance, "pid": os.getpid(), "boot": BOOT},
        status_code=202,
        model_name=agent.model.name,
        redactor=agent.redactor,
    )
    return dataclasses.replace(record, seq=-1)


def write_accepted(agent: Agent, request_id: str, session_id: str, instance: str) -> str | None:
    """Store the run's first record now; what to warn about when the store cannot take it
    (the run goes on: refusing it would not make the store writable)."""
    storage = agent.storage
    if storage is None or agent.audit_sink is None:
        return None
    try:
        direct_sink(storage).write([accepted_record(agent, request_id, session_id, instance)])
    except Exception as exc:
        logger.error("cannot store the first record of run %s: %s", request_id, exc)
        return (
            "audit: the run's first record (accepted) was not stored, so after a restart the "
            f"service may not know this run: {type(exc).__name__}: {_short(exc)}"
        )
    return None


def write_stopped(
    agent: Agent,
    earlier: list[AuditRecord],
    *,
    request_id: str,
    session_id: str,
    content: dict[str, Any],
    status_code: int,
    latency_ms: float = 0.0,
    at_once: bool = False,
) -> None:
    """The one writer of an in-process run's ``stopped`` ending: a ``RunManager`` record
    numbered after ``earlier`` (the records the run left, read back from the store), in the
    session of the last of them. Through the agent's sink, as its other records went, or
    ``at_once`` through the store's own (stored before this returns: the start's recovery,
    which nothing flushes after)."""
    storage, sink = agent.storage, agent.audit_sink
    if storage is None or sink is None:
        return
    record = lifecycle_record(
        earlier,
        request_id=request_id,
        session_id=earlier[-1].session_id if earlier else session_id,
        stage="RunManager",
        role=Role.STOPPED,
        content=content,
        status_code=status_code,
        model_name=agent.model.name,
        redactor=agent.redactor,
        latency_ms=latency_ms,
    )
    (direct_sink(storage) if at_once else sink).write([record])


def writes_at_once(agent: Agent, session_id: str) -> bool:
    """Whether the first record of a run of ``session_id`` is stored without waiting on the
    network: the store is one the project ships whose sessions and trail are in one place
    (memory, one SQLite file: the same file and its one write lock), and its sessions say an
    append answers at once (``memory.session.AnswersAtOnce``). The run layer then writes the
    record on the event loop, as the agent appends a turn there, where a thread hop would
    cost more than the write. Any other store gets it from a thread: its trail may wait on
    the network where its sessions do not."""
    storage = agent.storage
    if storage is None:
        return True  # nothing to write
    one_place = isinstance(storage, InMemoryStorage) or (
        isinstance(storage, SqlStorage) and storage.engine.dialect.name == "sqlite"
    )
    sessions = storage.sessions
    # The class, not the instance: as ``off_the_loop`` asks it (a delegating wrapper waits).
    if not one_place or not issubclass(type(sessions), AnswersAtOnce):
        return False
    return bool(sessions.answers_at_once(session_id, append=True))  # type: ignore[attr-defined]


def dropped(agent: Agent) -> int:
    """Records the store's write-behind writer has set aside so far (``lost_records``)."""
    sink = agent.audit_sink
    return sink.dropped if isinstance(sink, WriteBehindSink) else 0


def lost_records(agent: Agent, request_id: str, suspect: bool, dropped_before: int) -> list[str]:
    """What of the run's trail the store did not take, as warnings for its result: the records
    the write-behind writer set aside (by stage), or, if they are gone from its memory, that
    the trail lacks its ending. ``suspect``: the run already saw the store fail (its session
    turn or first record); otherwise only a writer that set records aside since
    ``dropped_before`` makes it look (the common case costs nothing)."""
    storage, sink = agent.storage, agent.audit_sink
    if storage is None or not isinstance(sink, WriteBehindSink):
        return []
    if not suspect and sink.dropped == dropped_before:
        return []
    sink.flush()  # the run's last step was queued a moment ago
    mine = [(r, error) for r, error in list(sink.quarantined) if r.request_id == request_id]
    if mine:
        stages = ", ".join(dict.fromkeys(f"{r.stage}/{r.role}" for r, _ in mine))
        return [
            f"audit: {len(mine)} records of this run's trail were not stored ({stages}): "
            f"{_short(mine[-1][1])}; the trail of this run is incomplete"
        ]
    if not suspect:
        return []
    try:
        stored = storage.records(request_id)
    except Exception as exc:
        return [f"audit: this run's trail could not be read back to check it: {_short(exc)}"]
    if not any(r.role == Role.OUTPUT.value for r in stored):
        return [
            f"audit: this run's trail was not stored whole ({len(stored)} records in the store, "
            "its output record missing)"
        ]
    return []


# -- on start: end what an earlier life of this instance left open --------------------------------


def recover_interrupted(agent: Agent, instance: str) -> list[str]:
    """Write an ``interrupted`` ending to every trail this instance's earlier life began and
    never ended (see the module docstring); the request ids ended."""
    storage = agent.storage
    if storage is None or agent.audit_sink is None:
        return []
    ended: list[str] = []
    for summary in storage.requests(limit=RECOVERY_SCAN):
        if summary["status"] != "incomplete":
            continue
        records = storage.records(summary["request_id"])
        if not records or not _left_by_earlier_life(records[0], instance):
            continue
        write_stopped(
            agent,
            records,
            request_id=records[0].request_id,
            session_id=records[0].session_id,
            content={"status": "interrupted", "error": INTERRUPTED},
            status_code=503,
            at_once=True,
        )
        ended.append(records[0].request_id)
    if ended:
        logger.warning(
            "%d runs of an earlier life of this instance (%s) had no ending; ended them as "
            "interrupted", len(ended), instance,
        )  # fmt: skip
    return ended


def _left_by_earlier_life(first: AuditRecord, instance: str) -> bool:
    if first.role != Role.ACCEPTED.value:
        return False  # not a run this service admitted (a library run, a queued run)
    try:
        content: dict[str, Any] = json.loads(first.content)
    except ValueError:
        return False
    if content.get("instance") != instance or content.get("boot") == BOOT:
        return False
    pid = content.get("pid")
    # The same pid in another boot is an earlier life (a container's process 1 restarted).
    return not isinstance(pid, int) or pid == os.getpid() or not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


# -- readiness ------------------------------------------------------------------------------------

PROBE_SESSION = ":readyz"
"""The session the probe writes and deletes: no user's (stored session ids are
``<user_id>:<session_id>``, and no user id is empty)."""

PROBE_BYTES = 16_384
"""Big enough to need new pages: a full disk cannot absorb it in free space."""


class StoreProbe:
    """Whether the store can be written: a small session written and deleted, at most once per
    ``every_s`` (anyone may ask ``/readyz``; the answer is shared meanwhile)."""

    def __init__(self, storage: Storage, every_s: float = 1.0) -> None:
        self.storage = storage
        self.every_s = every_s
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._problem: str | None = None

    def problem(self) -> str | None:
        """``None`` when a write went through just now; otherwise why it did not."""
        with self._lock:
            if time.monotonic() - self._at < self.every_s:
                return self._problem
            self._problem = self._try()
            self._at = time.monotonic()
            return self._problem

    def _try(self) -> str | None:
        sessions = self.storage.sessions
        try:
            sessions.append(PROBE_SESSION, [Message("user", "x" * PROBE_BYTES)])
            sessions.delete(PROBE_SESSION)
        except Exception as exc:
            logger.error("readiness check: the store cannot be written: %s", exc)
            return f"{type(exc).__name__}: {_short(exc)}"
        return None


def _short(exc: object, limit: int = 300) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:limit]


__all__: Sequence[str] = (
    "BOOT",
    "StoreProbe",
    "accepted_record",
    "direct_sink",
    "dropped",
    "lost_records",
    "recover_interrupted",
    "write_accepted",
    "write_stopped",
)
