"""What a worker does with one delivery of a queued run.

    claim the run (store)  ── finished / parked / waiting / dead ──▶ acknowledge, nothing to do
       │  busy: another worker holds it — wait (≤ one lease) until it shows life (stop at once)
       │        or its lease expires (take it over)
       ▼
    hold the lease: the worker's keeper extends it every third of ``lease_ttl``; a lost lease
    (taken over, or the run cancelled) cancels the run at once
       ▼
    agent.arun(..., journal=StoreJournal, approver=QueueApprover)
       │  model turns and tool calls of earlier attempts come from the journal
       │  a call that needs an undecided approval: recorded, the run is set aside
       ▼  (``waiting_approval``) and the worker is free; the answer re-enqueues it
    finish, in one fenced transaction: the status (``completed``, or ``failed`` when the run
       itself failed; ``timed_out`` past its ``run_timeout_s``), the session turn (completed
       runs only), the trail's one ending and the last event; hand the session to its next run

Everything a run does is fenced by the lease token of this attempt, so a copy of the run that
lost its lease writes nothing more, and starts no tool call once a heartbeat is overdue
(``worker.attempt``). A store that stays away past the retries of a write ends the attempt
with no ending (``StoreUnavailable``): the delivery goes back to the broker and the run
resumes from its journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from hermes_agent.agent import Agent
from hermes_agent.audit.recorder import lifecycle_record
from hermes_agent.audit.records import Role
from hermes_agent.errors import (
    HermesAgentError,
    StoreUnavailable,
    is_store_error,
)
from hermes_agent.events import Event, ResultEvent
from hermes_agent.runs.drive import drive
from hermes_agent.runs.events import (
    ApprovalRequiredEvent,
    ApprovalResolvedEvent,
    RunStoppedEvent,
    read_known,
)
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.runs.status import RunStatus, ending_status
from hermes_agent.stages import StageName
from hermes_agent.tools.registry import Tool
from hermes_agent.tracing import attach_incoming, detach
from hermes_agent.types import RunResult, ToolCall
from hermes_agent.worker.attempt import Attempt, retry_budget, transient, with_retries
from hermes_agent.worker.heartbeats import LeaseKeeper
from hermes_agent.worker.journal import CallGate, StoreJournal
from hermes_agent.worker.store import Claim, RunStore
from hermes_agent.worker.trail import AttemptTrail

logger = logging.getLogger("hermes_agent.worker")

Enqueue = Callable[[str], None]

Prepared = tuple[StoreJournal, tuple[int, float] | None, int]
"""What a run starts from (``RunWorker._prepare``): its journal, its deadline (ns since the
epoch, and the timeout in seconds) if it has one, and how many events it told already."""

Ending = Callable[[], str]
"""The write that ends an attempt, done by the delivery's thread once the run has left the
event loop (``RunWorker._run``); returns what became of the run."""

WORKER_EVENTS = (ApprovalRequiredEvent, ApprovalResolvedEvent, RunStoppedEvent)
"""Events written beside the pipeline's (by the worker, or with an approval's answer)."""


class QueueApprover:
    """Approvals of a queued run: a decision in the store answers; no decision yet records the
    call as pending and sets the run aside (the worker is freed; ``decide`` re-enqueues it).

    A decision is bound to the model turn, the tool and the exact arguments."""

    def __init__(self, store: RunStore, request_id: str, token: int, journal: StoreJournal):
        self.store = store
        self.request_id = request_id
        self.token = token
        self.journal = journal
        self.suspended: dict[str, Any] | None = None

    def key(self, call: ToolCall) -> str:
        """The model turn, and a digest of the call's id (unique in its turn and the same on
        every attempt), tool and arguments: one decision per call."""
        canonical = json.dumps([call.id, call.name, call.arguments], sort_keys=True, default=str)
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:24]
        return f"{self.journal.latest_turn}-{digest}"

    async def __call__(self, call: ToolCall, tool: Tool) -> tuple[bool, str]:
        key = self.key(call)
        # Read as every write of the attempt is: retried while the store is away, then
        # StoreUnavailable (the attempt ends, the run resumes) — never a denial.
        what = f"the approval of run {self.request_id}"
        found = await asyncio.to_thread(
            self.journal.attempt.write, what, self.store.approval, self.request_id, key
        )
        if found is not None and found[0] != "pending":
            status, reason = found
            return status == "approved", reason or status
        # Recorded with the run set aside, in one transaction (``RunStore.park_for_approval``).
        self.suspended = {"approval_id": key, "tool": call.name, "arguments": call.arguments}
        # Leave the run here: its state is in the journal, and the answer resumes it.
        raise asyncio.CancelledError


class _StoreSessions:
    """The agent's sessions, as a durable run reads them: a read the store fails (wrapped in
    the session store's ``StorageError``) is the store failing — ``StoreUnavailable``, so the
    attempt ends and the run resumes — not a failure of the run.

    A run's session is read by its delivery's thread before the run starts (``preload``), so
    that the run's own load, on the event loop every run of the worker shares, finds it read
    instead of waiting for the store there. Nothing else writes the session meanwhile: the
    claim lets one run of a session at a time go (a later one is parked), and a queued run
    saves its turn with its ending. That claim is the session's lock for queued runs, in every
    worker: ``lock`` gives the agent a lock of its own (the store's lease row, which serialises
    runs of services that run agents themselves, would cost a queued run two more round
    trips and end before its ending writes the turn)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._read: dict[str, tuple[Any, BaseException | None]] = {}
        self._guard = threading.Lock()

    def preload(self, session_id: str, *, empty: bool = False) -> None:
        """Read ``session_id`` now, for the next ``load`` of it (its failure too); ``empty``:
        the claim saw that it holds no message, so there is nothing to read."""
        found: tuple[Any, BaseException | None]
        if empty:
            found = ([], None)
        else:
            try:
                found = (self._inner.load(session_id), None)
            except Exception as exc:
                found = (None, exc)
        with self._guard:
            self._read[session_id] = found

    def answers_at_once(self, session_id: str, *, append: bool) -> bool:
        """A preloaded session is loaded from memory (``memory.session.AnswersAtOnce``); a
        queued run's turn is saved with its ending, never appended here."""
        if append:
            return False
        with self._guard:
            return session_id in self._read

    def forget(self, session_id: str) -> None:
        """Drop what ``preload`` read and no run loaded (the run ended before it did)."""
        with self._guard:
            self._read.pop(session_id, None)

    def load(self, session_id: str) -> Any:
        with self._guard:
            found = self._read.pop(session_id, None)
        try:
            if found is None:
                return self._inner.load(session_id)
            value, error = found
            if error is not None:
                raise error
            return value
        except Exception as exc:
            if is_store_error(exc):
                raise StoreUnavailable(f"session {session_id[:80]!r}: the store failed") from exc
            raise

    def lock(self, session_id: str) -> threading.Lock:
        return threading.Lock()  # held already: the claim lets one run of the session go

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class RunWorker:
    """Runs queued runs with one agent (one per worker process, shared by its threads)."""

    def __init__(
        self,
        agent: Agent,
        store: RunStore,
        enqueue: Enqueue,
        *,
        name: str,
        lease_ttl: float = 30.0,
    ) -> None:
        self.store = store
        self.enqueue = enqueue
        self.name = name
        self.lease_ttl = lease_ttl
        # The agent runs here as a fork whose trail goes through the attempt running each run
        # (``worker.trail``) and whose sessions are read as a durable run reads them: the
        # agent given is left as it was.
        self.trail: AttemptTrail | None = None
        if agent.audit_sink is not None:
            inner = agent.audit_sink
            self.trail = inner if isinstance(inner, AttemptTrail) else AttemptTrail(inner)
        self.sessions = _StoreSessions(agent.sessions)
        if self.trail is not None:
            self.agent = agent.fork(sessions=self.sessions, audit_sink=self.trail)
        else:
            self.agent = agent.fork(sessions=self.sessions)
        self.leases = LeaseKeeper(store, lease_ttl)
        self.calls = CallGate()  # the tool calls in progress in this process (its one loop)
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name="hermes-worker-loop", daemon=True
        )
        self._loop_thread.start()

    # -- one delivery -----------------------------------------------------------------

    def execute(self, request_id: str) -> str:
        """Handle one delivery of ``request_id``; returns what became of it (for the logs and
        for Celery's task result): ``completed``, ``failed``, ``timed_out``,
        ``waiting_approval``, ``cancelled``, ``lease_lost`` or the claim's outcome when it
        did not run. ``StoreUnavailable`` when the store stayed away (the claim, or the
        attempt, could not go on): the caller gives the delivery back to the broker."""
        claim = self._claim(request_id)
        if claim.outcome == "dead":  # its ending was written with the dead letter
            logger.error("run %s: dead-lettered", request_id)
        if claim.outcome != "claimed":
            logger.info("run %s: %s, not run by %s", request_id, claim.outcome, self.name)
            return claim.outcome
        assert claim.run is not None
        attempt = Attempt(
            self.store,
            claim.run.request_id,
            claim.token,
            self.lease_ttl,
            session_id=claim.run.session_id,
        )
        try:
            return self._run(claim, attempt)
        finally:
            if not attempt.handed_over:
                self._hand_over(claim.run.session_id)

    def _claim(self, request_id: str) -> Claim:
        """Claim the run; while another worker holds it, wait at most one lease: a heartbeat
        from the holder means it is alive (this copy stops at once), an expired lease means
        it died (this worker takes over). A store that fails is tried again for a while
        (``StoreUnavailable`` after that)."""
        deadline = time.monotonic() + self.lease_ttl + 1.0
        first_beat: int | None = None
        while True:
            claim = with_retries(
                self.store.claim,
                request_id,
                self.name,
                self.lease_ttl,
                budget=retry_budget(self.lease_ttl),
                what=f"the claim of run {request_id}",
            )
            if claim.outcome != "busy":
                return claim
            if first_beat is None:
                first_beat = claim.heartbeat_ns
            elif claim.heartbeat_ns != first_beat or time.monotonic() > deadline:
                return claim  # alive elsewhere: a second copy stops here
            time.sleep(min(0.25, self.lease_ttl / 6))

    def _run(self, claim: Claim, attempt: Attempt) -> str:
        assert claim.run is not None
        run = claim.run
        holder: list[asyncio.Task[Any]] = []

        def lost() -> None:  # the lease is someone else's now: stop the run at once
            if holder:
                self._loop.call_soon_threadsafe(holder[0].cancel)

        async def drive() -> Ending:
            current = asyncio.current_task()
            assert current is not None
            holder.append(current)
            if attempt.lost:
                raise asyncio.CancelledError
            return await self._drive(claim, attempt)

        lease = self.leases.hold(attempt, lost)
        if self.trail is not None:
            self.trail.hold(attempt)
        try:
            # All runs of this process share one event loop (model clients are bound to the
            # loop they first ran on); this thread (the delivery's own) waits for its run,
            # then writes its ending: off the loop, with no thread hop of its own.
            self.sessions.preload(run.session_id, empty=not claim.history)
            ending = asyncio.run_coroutine_threadsafe(drive(), self._loop).result()
            return ending()
        except StoreUnavailable:
            self._abandon(attempt)
            raise
        finally:
            self.sessions.forget(run.session_id)
            if self.trail is not None:
                self.trail.release(attempt)
            self.leases.release(lease)
            # Its calls count as in progress until its ending (which may carry their
            # outcomes) is written, or the attempt stopped.
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing waits on it
                self._loop.call_soon_threadsafe(self.calls.leave_all, attempt)

    def _abandon(self, attempt: Attempt) -> None:
        """An attempt that gave up on its store writes no ending: the run goes back to
        ``queued`` if the store takes that (fenced: a no-op once another attempt holds it), or
        else its lease lapses; either way its journal lets the next attempt resume it."""
        cause = attempt.broken.__cause__ if attempt.broken is not None else None
        # A write the store refuses for good is the run's own failure: it costs a redelivery,
        # so that such a run ends dead after max_redeliveries instead of looping.
        refused = cause is not None and not transient(cause)
        try:
            with_retries(
                partial(self.store.release, charge=refused),
                attempt.request_id,
                attempt.token,
                budget=retry_budget(self.lease_ttl),
                what=f"the release of run {attempt.request_id}",
            )
        except Exception:
            logger.warning("run %s: not released; its lease lapses", attempt.request_id)

    def close(self) -> None:
        """Stop the run loop (runs still on it are abandoned: their leases expire, and another
        worker resumes them), first closing the connections the agent's models opened on it
        when no run is left on it (a run cut off from its model would end failed)."""
        if self._loop.is_running():
            closing = asyncio.run_coroutine_threadsafe(self._close_when_idle(), self._loop)
            try:
                closing.result(timeout=5)
            except Exception:  # a stuck close must not hold up the worker's shutdown
                logger.warning("the models' connections were not closed in 5 s")
                closing.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=5)
        self.leases.close()
        self.agent.close()  # the fork's own tool pools (the agent given is its owner's)

    async def _close_when_idle(self) -> None:
        if any(task is not asyncio.current_task() for task in asyncio.all_tasks()):
            logger.warning("runs still on the loop as the worker stops: their leases lapse")
            return
        await self.agent.close_connections()

    async def _drive(self, claim: Claim, attempt: Attempt) -> Ending:
        """The run on the event loop; returns its ending, which the delivery's thread writes
        (``_run``): a write of the store never runs on the loop."""
        assert claim.run is not None
        run, token = claim.run, claim.token
        rid = run.request_id
        request = QueuedRequest.model_validate(run.request)
        timeout: asyncio.Timeout | None = None
        limit: tuple[int, float] | None = None
        approver: QueueApprover | None = None
        # The submitter's trace continues here (the run's spans join it).
        joined = attach_incoming(self.agent, request.trace_context)
        try:
            # Reads and writes of the store happen in a thread, never on the loop that every
            # run of this worker shares; a first claim with no deadline reads nothing.
            if claim.resumed or claim.last_seq is None or claim.timed:
                prepared = await asyncio.to_thread(self._prepare, claim, attempt)
            else:
                prepared = self._prepare(claim, attempt)
            journal, limit, told = prepared
            approver = QueueApprover(self.store, rid, token, journal)
            emitted = 0

            def listener(event: Event) -> None:
                nonlocal emitted
                emitted += 1
                if emitted > told and attempt.holds():  # a lapsed attempt says nothing more
                    attempt.add_event(event.to_dict())  # written with the model turn

            if limit is not None and limit[0] <= time.time_ns():
                raise TimeoutError  # past its deadline already (it waited, or was resumed)
            left = None if limit is None else (limit[0] - time.time_ns()) / 1e9
            async with asyncio.timeout(left) as timeout:
                result = await drive(
                    self.agent,
                    request,
                    session_id=run.session_id,
                    request_id=rid,
                    listener=listener,
                    journal=journal,
                    approver=approver,
                )
        except TimeoutError:
            if limit is None or (timeout is not None and not timeout.expired()):
                return partial(
                    self._end, attempt, "failed", "the run failed unexpectedly: TimeoutError"
                )
            return partial(
                self._end,
                attempt,
                "timed_out",
                f"the run took longer than run_timeout_s ({limit[1]:g} s) and was stopped",
            )
        except asyncio.CancelledError:
            if approver is not None and approver.suspended is not None:
                return partial(self._park, attempt, approver.suspended)
            if attempt.lost or not attempt.holds():
                return partial(self._lost, rid)
            raise
        except StoreUnavailable:
            raise  # the attempt ends without an ending (``_run``)
        except HermesAgentError as exc:
            return partial(self._end, attempt, "failed", str(exc))
        except Exception as exc:
            if is_store_error(exc):  # the store, under the agent (its session, its trail)
                raise StoreUnavailable(f"run {rid}: the store failed: {exc!r}"[:500]) from exc
            logger.exception("run %s failed", rid)
            return partial(
                self._end,
                attempt,
                "failed",
                f"the run failed unexpectedly: {type(exc).__name__}: {exc}",
            )
        finally:
            if joined is not None:
                detach(joined)
        attempt.alive()  # a run that gave up on its store mid-way has no ending to write
        return partial(self._finish, attempt, result)

    def _finish(self, attempt: Attempt, result: RunResult) -> str:
        """The ending of a run that has a result: its status, its answer's record and event
        and its session turn, in one fenced transaction."""
        rid = attempt.request_id
        status = ending_status(result)
        wire = ResultEvent(result).to_dict()
        try:
            following = attempt.write(
                f"the ending of run {rid}",
                self.store.finish,
                rid,
                attempt.token,
                status,
                result=wire["result"],
                error=result.error if status != "completed" else None,
                turn=attempt.turn,
                output=attempt.output,
                event=wire,
                batch=attempt.take(),
            )
        except asyncio.CancelledError:
            return self._lost(rid)
        self._hand_over_to(following, attempt)
        return status

    def _prepare(self, claim: Claim, attempt: Attempt) -> Prepared:
        """Before the run (in a thread): its deadline, and on a resume what earlier attempts
        left — the journal, the events told already (``told``: the pipeline's, which the run
        emits again in the same order as it replays) and the ``resumed`` record. A first
        claim reads nothing back: there is nothing yet (and no thread is needed)."""
        assert claim.run is not None
        rid, token = claim.run.request_id, claim.token
        limit = None
        if claim.timed:
            limit = attempt.write(
                f"the deadline of run {rid}", self.store.start_deadline, rid, token, time.time_ns()
            )
        if not claim.resumed and claim.last_seq is not None:
            attempt.last_seq = claim.last_seq
            first = StoreJournal(
                self.store, rid, token, attempt, entries={}, resumes=False, gate=self.calls
            )
            return first, limit, 0
        journal = StoreJournal(self.store, rid, token, attempt, gate=self.calls)
        events = attempt.write(f"the events of run {rid}", self.store.events, rid)
        attempt.last_seq = max((seq for seq, _ in events), default=0)
        told = sum(1 for _, wire in events if not isinstance(read_known(wire), WORKER_EVENTS))
        if claim.resumed:
            self._record_resumed(claim, journal)
        return journal, limit, told

    def _park(self, attempt: Attempt, asked: dict[str, Any]) -> str:
        rid = attempt.request_id
        required = ApprovalRequiredEvent(
            approval_id=asked["approval_id"],
            request_id=rid,
            tool=asked["tool"],
            arguments=asked["arguments"],
            created=datetime.now(UTC).isoformat(),
            expires=None,  # it waits until answered or its run cancelled
        ).to_dict()
        try:
            attempt.write(
                f"the approval of run {rid}",
                self.store.park_for_approval,
                rid,
                attempt.token,
                asked["approval_id"],
                asked["tool"],
                asked["arguments"],
                required,
                batch=attempt.take(),
            )
        except asyncio.CancelledError:
            return self._lost(rid)
        return "waiting_approval"

    def _lost(self, request_id: str) -> str:
        try:
            found = self.store.get(request_id)
        except Exception:
            found = None
        if found is not None and found.status == "cancelled":
            return "cancelled"  # its ending came with the cancellation
        logger.warning("run %s: this worker's lease passed to another; stopped", request_id)
        return "lease_lost"

    def _end(self, attempt: Attempt, status: RunStatus, error: str) -> str:
        """End the run without an answer (``failed``, ``timed_out``): its row, its trail's
        ``stopped`` record and its ``run_stopped`` event, in one fenced transaction."""
        try:
            following = attempt.write(
                f"the ending of run {attempt.request_id}",
                self.store.finish,
                attempt.request_id,
                attempt.token,
                status,
                error=error,
                batch=attempt.take(),
            )
        except asyncio.CancelledError:
            return self._lost(attempt.request_id)
        self._hand_over_to(following, attempt)
        return status

    def _record_resumed(self, claim: Claim, journal: StoreJournal) -> None:
        """One ``resumed`` record in the run's trail: which attempt, on which worker, from which
        step (the steps before it are whole in the trail and are not done again)."""
        assert claim.run is not None
        storage = self.agent.storage
        sink = self.agent.audit_sink
        if storage is None or sink is None:
            return
        earlier = storage.records(claim.run.request_id)
        executed = {r.step for r in earlier if r.stage == StageName.TOOL_EXECUTOR}
        from_step = max(executed) + 1 if executed else 0
        content = {
            "attempt": claim.run.claims + 1,
            "worker": self.name,
            "from_step": from_step,
            "takeover": claim.run.status == "running",
            "journal_entries": len(journal._entries),
        }
        record = lifecycle_record(
            earlier,
            request_id=claim.run.request_id,
            session_id=claim.run.session_id,
            stage="Worker",
            role=Role.RESUMED,
            content=content,
            status_code=200,
            model_name=self.agent.model.name,
            redactor=self.agent.redactor,
            step=from_step,
        )
        # Written at once (fenced): the agent's recorder numbers the run's records after
        # those in the store, this one included.
        self.store.write_records(claim.run.request_id, claim.token, [record])

    def _hand_over_to(self, following: str | None, attempt: Attempt) -> None:
        """The run ended and its ending named the session's next run (``None``: none waits)."""
        attempt.handed_over = True
        if following is None:
            return
        try:
            self.enqueue(following)
        except Exception:  # the sweeper hands it over later
            logger.exception("run %s: could not be handed its turn", following)

    def _hand_over(self, session_id: str) -> None:
        """The session's next run (parked while this one ran) goes to the queue now."""
        try:
            following = self.store.next_of_session(session_id)
            if following is not None:
                self.enqueue(following)
        except Exception:  # the sweeper hands it over later
            logger.exception("session %s: could not hand over to its next run", session_id)

    # -- the sweeper ------------------------------------------------------------------

    def sweep(self) -> list[str]:
        """Re-enqueue runs lost with their worker, and parked runs whose hand-over was lost."""
        found = self.store.to_sweep(self.lease_ttl)
        for request_id in found:
            logger.warning("run %s: re-enqueued by %s's sweeper", request_id, self.name)
            self.enqueue(request_id)
        return found
