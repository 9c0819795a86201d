"""Runs that outlive their connection.

Each run is an asyncio task of its own; what it emits goes into an in-memory log with
increasing ids (1, 2, ...), so any number of clients can follow it, drop, and come back with
the last id they saw. The log of a finished run is kept a while (``max_finished_runs``,
``finished_run_ttl_s``); after that the store's audit records answer for it.

Session ids are kept per user: the store holds ``<user_id>:<session_id>``, so one user's
session id can never name another user's conversation, and ownership survives a restart.

Every run passes the run layer's gate (``runs.gate``) in ``start``, whichever door asked for
it: the service is accepting, the request (size, session id, toolsets that only narrow), the
global and per-user limits on runs in flight, then the user's daily quota; its tokens are
counted per model turn however it ends (``pipeline.watch``: a turn cut short counts its prompt
and what it streamed).

A cancel stops the run's model request and its async and subprocess tools; a sync in-process
tool cannot be stopped: it runs on on its thread, the run's ending names it as still running,
and its result, when it comes, is written to the trail as a ``late_result`` record.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import time
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Awaitable, Iterator
from concurrent.futures import Future
from typing import Any, Literal, TypeVar

from hermes_agent.agent import Agent
from hermes_agent.audit.recorder import lifecycle_record
from hermes_agent.audit.records import Role
from hermes_agent.errors import HermesAgentError
from hermes_agent.events import Event, InputEvent, ResultEvent
from hermes_agent.late_cancels import finish_despite_cancels
from hermes_agent.pipeline.watch import AbandonedCall, RunWatch, watching
from hermes_agent.protocol.chatml import to_json
from hermes_agent.runs.approvals import EXPIRED, ApprovalBook
from hermes_agent.runs.drive import drive
from hermes_agent.runs.events import ApprovalResolvedEvent, RunStoppedEvent
from hermes_agent.runs.gate import Admission, Gate, tokens_used
from hermes_agent.runs.gate import RunRejected as RunRejected
from hermes_agent.runs.metrics import ServiceMetrics
from hermes_agent.runs.principal import Principal
from hermes_agent.runs.principal import client_session_id as client_session_id
from hermes_agent.runs.principal import stored_session_id as stored_session_id
from hermes_agent.runs.quotas import MemoryQuotaStore, Quotas
from hermes_agent.runs.request import RunRequest as RunRequest
from hermes_agent.runs.run_log import Run as Run
from hermes_agent.runs.settings import RunStatus, ServiceSettings
from hermes_agent.runs.status import STOP_CODES as STOP_CODES
from hermes_agent.runs.status import ending_status
from hermes_agent.runs.trail import (
    dropped,
    lost_records,
    write_accepted,
    write_stopped,
    writes_at_once,
)
from hermes_agent.tools.registry import Tool
from hermes_agent.types import RunResult, ToolCall

logger = logging.getLogger("hermes_agent.server")
_T = TypeVar("_T")

_current_run: contextvars.ContextVar[Run | None] = contextvars.ContextVar(
    "hermes_service_run", default=None
)


async def _beyond_cancel(work: Awaitable[_T]) -> _T:
    """``await work`` to its end, whatever cancels this task meanwhile: for the steps of a run
    that is already ending (``late_cancels``)."""
    done, _ = await finish_despite_cancels(work)
    return done.result()


@dataclasses.dataclass(frozen=True, slots=True)
class _Ending:
    """How a run ended, made known at once by ``RunManager._publish``: its status, its last
    event (``result`` or ``run_stopped``), its error and its result."""

    status: RunStatus
    wire: dict[str, Any]
    error: str | None = None
    result: dict[str, Any] | None = None


class RunManager:
    """Starts runs, keeps their logs, answers approvals, cancels, and shuts down cleanly.

    ``agent`` must have been made with ``approver=manager.approver`` (``Agent.fork``); the
    approver finds its run through a context variable, so one agent — one tool pool, one set
    of rate limits and caches — serves every run.
    """

    def __init__(
        self, settings: ServiceSettings, metrics: ServiceMetrics, approvals: ApprovalBook
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.approvals = approvals
        self.agent: Agent | None = None
        self.quotas = Quotas(settings.quotas, MemoryQuotaStore())
        """The daily quotas; ``create_app`` keeps their counts where the API keys are."""
        self.runs: OrderedDict[str, Run] = OrderedDict()
        self._gate: Gate | None = None
        self.accepting = True
        self._live: set[Run] = set()
        self._finished: deque[Run] = deque()
        """Finished runs in the order they finished: what ``_evict`` forgets first."""
        self._watches: weakref.WeakKeyDictionary[Run, RunWatch] = weakref.WeakKeyDictionary()
        """What each run spent so far and the calls it abandoned (``pipeline.watch``)."""

    # -- starting and following ----------------------------------------------------------

    @property
    def gate(self) -> Gate:
        """The run layer's gate, over this manager's settings and quotas."""
        if self._gate is None or self._gate.quotas is not self.quotas:
            self._gate = Gate(self.settings.gate_limits(), self.quotas, self.metrics)
        return self._gate

    async def start(
        self, principal: Principal, request: RunRequest, *, listening: bool = True
    ) -> Run:
        """Start a run and return it once the agent has taken it up (its first record is
        stored before: the id resolves, even after a crash, from the moment it is returned).
        Raises ``RunRejected`` (the gate,
        shutting down), ``SessionIdError`` (a session id the store cannot hold) or
        ``HermesAgentError`` (a request the agent refuses before it starts: channel, output
        format).

        With ``listening`` the caller counts as following the run from the start (so an
        approval can wait for it) and calls ``run.detach()`` when it stops following."""
        if not self.accepting or self.agent is None:
            raise RunRejected(503, "the service is shutting down; try again on another instance")
        owner, gate = principal.user_id, self.gate
        storage = self.agent.storage
        await gate.check_apart(
            principal, request, self.agent, storage.max_id_length if storage else 10**6
        )
        gate.check_room(self.in_flight(), self.in_flight(owner))
        minted = not request.session_id
        run = Run(owner, request.session_id or uuid.uuid4().hex, new_session=minted)
        # In flight from here: starts that wait on the quota store at once count each other.
        self._live.add(run)
        try:
            admission = await gate.take_quota(principal)
        except BaseException:
            self._live.discard(run)
            raise
        if not self.accepting:  # the shutdown began while the quota was asked
            self._live.discard(run)
            await gate.give_back(admission)
            raise RunRejected(503, "the service is shutting down; try again on another instance")
        self._evict()
        # The id is given out once start returns (a header, an event stream's first frame):
        # from then on it must resolve, here and — after a crash — from the store.
        agent = self.agent
        run.id = str(uuid.uuid4())
        run.dropped_before = dropped(agent)
        if not request.dry_run:  # a dry run keeps no trail: nothing of it runs
            stored, instance = stored_session_id(owner, run.session_id), self.settings.instance
            try:
                if writes_at_once(agent, stored):  # memory, a SQLite file: no thread hop
                    problem = write_accepted(agent, run.id, stored, instance)
                else:  # shielded: a caller gone meanwhile must not leave the record half-known
                    write = asyncio.to_thread(write_accepted, agent, run.id, stored, instance)
                    problem = await asyncio.shield(write)
            except BaseException:
                self._live.discard(run)
                await asyncio.shield(gate.give_back(admission))
                raise
            if problem is not None:
                run.warnings.append(problem)
        if not self.accepting:  # the shutdown began while the record was written
            self._live.discard(run)
            await gate.give_back(admission)
            self._stop(run, "cancelled", "the service shut down before the run started")
            if not request.dry_run:
                await self._record_stop(run, agent, run.status, run.error)
            raise RunRejected(503, "the service is shutting down; try again on another instance")
        self._register(run, run.id)
        run.listeners = int(listening)
        run.task = asyncio.create_task(self._drive(run, agent, request, admission))
        await run.ready.wait()
        if run.start_error is not None:
            if self.runs.get(run.id) is run:  # refused: its id was never given out
                del self.runs[run.id]
            await gate.give_back(admission)  # it never started: it does not count
            raise run.start_error
        return run

    def get(self, request_id: str, owner: str, *, admin: bool = False) -> Run | None:
        """A run this process holds, if ``owner`` may see it."""
        run = self.runs.get(request_id)
        if run is None or (run.owner != owner and not admin):
            return None
        return run

    def pending(self, run: Run) -> list[dict[str, Any]]:
        """The unanswered approvals of a run, as the API lists them."""
        return [p.to_dict() for p in self.approvals.pending_for(run.id)]

    def cancel(self, run: Run, reason: str = "cancelled by the client") -> bool:
        """Cancel a run in flight: its model request, its async and subprocess tools; a sync
        in-process tool runs on (``still_running``). ``False`` when it was over already."""
        if run.done or run.task is None:
            return False
        run.cancel_reason = reason
        run.task.cancel()
        return True

    def still_running(self, run: Run) -> list[dict[str, Any]]:
        """The calls ``run`` abandoned when it stopped that are still running (a sync
        in-process tool cannot be stopped), as ``{"name", "call_id", "step"}``."""
        watch = self._watches.get(run)
        if watch is None:
            return []
        return [_call_view(call) for call in watch.still_running()]

    @contextlib.contextmanager
    def holding(self, owner: str, what: str) -> Iterator[None]:
        """Count work of ``owner`` that is not a run of this manager's (a replay) as one run in
        flight while it lasts, so the limits hold it too."""
        placeholder = Run(owner, what)
        self._live.add(placeholder)
        try:
            yield
        finally:
            self._live.discard(placeholder)

    def in_flight(self, owner: str | None = None) -> int:
        """Runs not finished, of one owner or of all."""
        return sum(1 for run in self._live if owner is None or run.owner == owner)

    # -- the run itself -------------------------------------------------------------------

    async def _drive(
        self, run: Run, agent: Agent, request: RunRequest, admission: Admission
    ) -> None:
        _current_run.set(run)
        watch = self._watches[run] = RunWatch()
        self.metrics.in_flight.inc()
        since = time.perf_counter()

        def listener(event: Event) -> None:
            nonlocal since
            if isinstance(event, InputEvent) and not run.started:
                run.started = True
                run.ready.set()
            wire = event.to_dict()
            since = self.metrics.observe(event, since)
            run.add(wire)

        ending: _Ending | None = None
        try:
            async with asyncio.timeout(self.settings.run_timeout_s):
                # ``watch``: every model turn's spend, however it ends, and the calls a
                # cancel had to leave running.
                with watching(watch):
                    result = await drive(
                        agent,
                        request,
                        session_id=stored_session_id(run.owner, run.session_id),
                        request_id=run.id,
                        listener=listener,
                        # Pieces of the reply only for whoever reads them: asked for, or
                        # someone follows the run's events as the turn starts.
                        stream=lambda: request.stream or run.followers > 0,
                        new_session=run.new_session,
                    )
                # The run has had its effects and recorded its output: a cancel from here on
                # is too late (a stopped record after the output would end it twice).
                run.warnings.extend(await _beyond_cancel(self._lost_records(run, agent, result)))
        except TimeoutError:
            ending = self._stopped(
                "timed_out",
                f"the run took longer than run_timeout_s ({self.settings.run_timeout_s:g} s) "
                "and was stopped" + _running_note(watch.still_running()),
            )
        except asyncio.CancelledError:
            reason = run.cancel_reason or "cancelled"
            ending = self._stopped("cancelled", reason + _running_note(watch.still_running()))
        except HermesAgentError as exc:
            if run.started:
                ending = self._stopped("failed", str(exc))
            else:  # refused before it started: the caller gets the message (422)
                run.start_error = exc
                run.status = "failed"
                run.error = str(exc)
        except Exception as exc:
            logger.exception("run %s failed", run.id or "(starting)")
            problem = f"the run failed unexpectedly: {type(exc).__name__}: {exc}"
            ending = self._stopped("failed", problem)
        else:
            ending = self._answered(run, result)
        finally:
            given_out = run.start_error is None
            try:
                if given_out:  # every model turn counts, however the run ended...
                    wires = [wire for _, wire in run.events]
                    told = tokens_used([*wires, ending.wire] if ending is not None else wires)
                    tokens = max(told, watch.spend.total)  # a turn cut short: its estimate
                    settled = self.gate.settle(
                        run.owner,
                        run.id,
                        tokens,
                        once=False,
                        day=admission.day,
                        reserved=admission.reserved,
                    )
                    # A cancel now (a client's, the shutdown's) is too late: the run is ending.
                    await _beyond_cancel(settled)
            finally:  # ...before anyone hears of the ending: the owner's next run is admitted
                if ending is not None:  # against a day that counts this one
                    try:
                        if ending.result is None and not request.dry_run:
                            # Stopped without an output record: the trail's ending is
                            # written before the run is said to have ended, as a queued
                            # run's is, so whoever hears of the ending can read it.
                            await self._record_stop(run, agent, ending.status, ending.error)
                    finally:
                        self._publish(run, ending)
            run.finished = time.time()
            self._live.discard(run)
            self.metrics.in_flight.dec()
            if given_out:
                self.metrics.runs.labels(run.status).inc()
                self._finished.append(run)
            run.ready.set()
            run.poke()
            if ending is None and run.error is not None and not request.dry_run:
                # Refused after its first record was written: its trail ends here.
                await self._record_stop(run, agent, run.status, run.error, 422)
            for call in watch.abandoned:  # after the ending: their results come too late
                self._record_late(run, agent, call)

    def _record_late(self, run: Run, agent: Agent, call: AbandonedCall) -> None:
        """Write a ``late_result`` record to the trail of ``run`` when a call it abandoned
        finishes (on the tool's own thread, which the store may block: never on the loop)."""
        sink, storage = agent.audit_sink, agent.storage
        if sink is None or storage is None:
            return
        since = time.time()

        def write(future: Future[Any]) -> None:
            if future.cancelled():  # it never started: nothing ran, nothing to record
                return
            problem = future.exception()
            content: dict[str, Any] = {
                **_call_view(call),
                "status": "error" if problem is not None else "success",
            }
            if problem is not None:
                content["error"] = f"{type(problem).__name__}: {problem}"[:LATE_RESULT_CHARS]
            else:
                value = future.result()
                text = to_json(value)
                fits = len(text) <= LATE_RESULT_CHARS
                content["result"] = value if fits else text[:LATE_RESULT_CHARS] + "…"
            try:
                left = storage.records(run.id)
                session = (
                    left[-1].session_id if left else stored_session_id(run.owner, run.session_id)
                )
                record = lifecycle_record(
                    left,
                    request_id=run.id,
                    session_id=session,
                    stage="RunManager",
                    role=Role.LATE_RESULT,
                    content=content,
                    status_code=500 if problem is not None else 200,
                    model_name=agent.model.name,
                    redactor=agent.redactor,
                    latency_ms=(time.time() - since) * 1000,
                    step=call.step,
                )
                sink.write([record])
            except Exception:
                logger.exception("cannot record the late result of a call of run %s", run.id)

        if call.future.done():  # it ended meanwhile: not on the loop either
            asyncio.get_running_loop().run_in_executor(None, write, call.future)
        else:
            call.future.add_done_callback(write)

    def _answered(self, run: Run, result: RunResult) -> _Ending:
        """The ending of a run that went through (``_publish`` makes it known)."""
        result.warnings.extend(run.warnings)
        wire = ResultEvent(result).to_dict()
        wire["result"]["session_id"] = run.session_id
        # A run whose model failed after its retries (or a stage, a hook...) failed: its
        # result stays, with the error (runs.status.ending_status).
        status = ending_status(result)
        error = None
        if status == "failed":
            error = result.error or f"the run ended with status {result.status}"
        return _Ending(status, wire, error, wire["result"])

    def _stopped(self, status: RunStatus, error: str) -> _Ending:
        """The ending of a run stopped before its output (``_publish`` makes it known)."""
        return _Ending(status, RunStoppedEvent(status=status, error=error).to_dict(), error)

    def _publish(self, run: Run, ending: _Ending) -> None:
        """Make the run's ending known: its result (or error), its last event, its status."""
        if ending.result is not None:
            run.result = ending.result
        if ending.error is not None:
            run.error = ending.error
        run.add(ending.wire, milestone=True)
        run.status = ending.status

    async def _lost_records(self, run: Run, agent: Agent, result: RunResult) -> list[str]:
        """What of the run's records the store did not take (``run_records.lost_records``):
        looked for when the run saw the store fail, or its writer set records aside."""
        suspect = bool(run.warnings) or any(w.startswith("storage:") for w in result.warnings)
        if not suspect and dropped(agent) == run.dropped_before:
            return []
        try:
            return await asyncio.to_thread(lost_records, agent, run.id, suspect, run.dropped_before)
        except Exception as exc:  # looking must not fail a run that has had its effects
            logger.exception("cannot check what the store kept of run %s", run.id)
            return [f"audit: this run's trail could not be checked: {type(exc).__name__}"]

    async def _record_stop(
        self,
        run: Run,
        agent: Agent,
        status: RunStatus,
        error: str | None,
        code: int | None = None,
    ) -> None:
        """End the audit trail of a run that stopped without an output (cancelled, timed out,
        failed) with one record saying so: stage ``RunManager``, role ``stopped``, the status
        code of ``STOP_CODES``, content ``{"status", "error"}`` as JSON, numbered after the
        records the run left (read back from the store). A run's trail thus ends with an
        ``output`` or a ``stopped`` record; one that ends with neither was cut short by a
        crash. A store that cannot take it is logged; the run is over either way."""
        sink, storage = agent.audit_sink, agent.storage
        if sink is None or storage is None:
            return
        stopped_at = time.time()

        def write() -> None:
            write_stopped(
                agent,
                storage.records(run.id),  # flushes what the run's recorder handed over
                request_id=run.id,
                session_id=stored_session_id(run.owner, run.session_id),
                content={"status": status, "error": error},
                status_code=code or STOP_CODES.get(status, 500),
                latency_ms=(stopped_at - run.created) * 1000,
            )

        try:
            # Shielded: cancelled again while it writes, the record is still written.
            await asyncio.shield(asyncio.to_thread(write))
        except Exception:
            logger.exception("cannot record in the audit trail how run %s stopped", run.id)

    def _register(self, run: Run, request_id: str) -> None:
        run.id = request_id
        self.runs[request_id] = run

    def _stop(self, run: Run, status: RunStatus, error: str) -> None:
        self._publish(run, self._stopped(status, error))

    # -- approvals ------------------------------------------------------------------------

    async def approver(self, call: ToolCall, tool: Tool) -> Literal[True] | tuple[bool, str]:
        """The agent's approver: ask the run's owner over the API and wait for the answer."""
        run = _current_run.get()
        if run is None:
            return False, "the call was not made by a service run, so nobody can approve it"
        if self.settings.approval_policy == "deny" and run.listeners == 0:
            return False, "nobody was listening to the run to approve it (approval_policy: deny)"
        ttl = self.settings.approval_timeout_s
        pending = self.approvals.open(run.id, run.owner, tool.name, call.arguments, ttl)
        run.status = "waiting_approval"
        run.add(pending.event().to_dict(), milestone=True)
        try:
            approved, reason = await asyncio.wait_for(asyncio.shield(pending.decision), ttl)
        except TimeoutError:
            approved, reason = False, EXPIRED
        finally:
            if not pending.decision.done():  # expired or cancelled: no later answer counts
                pending.decision.set_result((False, EXPIRED))
            if not self.approvals.pending_for(run.id) and not run.done:
                run.status = "running"
        run.add(ApprovalResolvedEvent(pending.id, approved, reason).to_dict())
        return (True, reason) if approved else (False, reason)

    # -- memory and shutdown ----------------------------------------------------------------

    def _evict(self) -> None:
        """Forget finished runs beyond the count or older than the age the settings allow,
        oldest first (a walk over only the runs it forgets, not over every run held)."""
        oldest = time.time() - self.settings.finished_run_ttl_s
        finished = self._finished
        while finished and (
            len(finished) > self.settings.max_finished_runs
            or (finished[0].finished or 0.0) < oldest
        ):
            run = finished.popleft()
            if self.runs.get(run.id) is run:
                del self.runs[run.id]
            self.approvals.forget_run(run.id)

    _shutdown: asyncio.Future[None] | None = None
    """The shutdown in progress, once ``shutdown`` was called."""

    async def shutdown(self, grace: float) -> None:
        """Stop accepting runs, let those in flight finish for up to ``grace`` seconds, then
        cancel the rest (their trails end with a ``stopped`` record) and wait for them to end.

        A server may call it as soon as it is told to stop (SIGTERM), while it still waits for
        its connections: clients following a run then get its ``run_stopped`` event, and the
        app's own call at lifespan shutdown waits for that same shutdown instead of granting
        a second grace period."""
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self._drain(grace))
        await asyncio.shield(self._shutdown)

    async def _drain(self, grace: float) -> None:
        self.accepting = False
        tasks = [run.task for run in self._live if run.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace)
            for run in list(self._live):
                self.cancel(run, "the service shut down before the run finished")
            if late:
                await asyncio.wait(late, timeout=max(grace, 5.0))


# -- the in-process backend (runs.backend.RunBackend) -----------------------------------------


LATE_RESULT_CHARS = 4000
"""How much of a late result its trail record keeps (nothing reads it but a person)."""


def _call_view(call: AbandonedCall) -> dict[str, Any]:
    return {"name": call.name, "call_id": call.call_id, "step": call.step}


def _running_note(calls: list[AbandonedCall]) -> str:
    """What an ending says of the calls it could not stop (none: nothing)."""
    if not calls:
        return ""
    named = ", ".join(f"{call.name} ({call.call_id})" for call in calls)
    return (
        f"; still running: {named} — a sync in-process tool cannot be stopped; its result "
        "will be written to the trail (late_result) and used by nothing"
    )
