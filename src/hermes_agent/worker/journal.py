"""A run's journal in the store (``pipeline.journal.RunJournal``), fenced by the worker's lease.

Keys: ``turn/<n>`` for the n-th model request of the run, ``call/<step>/<index>`` for a tool
call. Writes go in batches, one fenced transaction per model turn (``RunStore.write_batch``):

    model turn n arrives     ──▶ kept (``turn/n``), with the events and trail records so far
    its calls about to start ──▶ their intents (``started``) join it, and the whole batch is
                                 written at once, off the event loop, before any tool runs
                                 (calls starting together share the transaction)
    a call's outcome         ──▶ an idempotent call's rides with the next transaction (lost
                                 with a crash, the call runs again: harmless); any other call's
                                 is written at once (lost, the model would be told the call
                                 was interrupted)
    a turn with no calls     ──▶ rides with the next transaction: the run's approval or its
                                 ending (``RunStore.finish``)

Every transaction checks the run's fencing token, so a worker whose lease passed to another
writes nothing more (``LeaseLost``) and the run stops there; a store that fails is tried again
for a while, then the attempt ends (``StoreUnavailable``; ``worker.attempt``) and what it had
not written is done again by the attempt that resumes the run. The session turn is kept back
and saved with the run's ending.

The start of a tool call: the transaction that writes its intent also extends the lease (from
when the store runs it), so the check that the lease is this attempt's and the intent commit
together or not at all: a refused intent leaves nothing, and the next attempt runs the call.
Right before the tool starts, the attempt checks that its lease is still its own
(``Attempt.check_lease``): a store that answered a lease or more after the write was sent
(it paused) is asked again, so a pause does not turn the calls that came due during it into
calls the model is told were interrupted. "Interrupted" thus means the intent was written
and the attempt then died, froze past its lease, or lost its store before the call could
finish.

Calls of a run whose earlier death could not be told apart from its neighbours' run alone in
their process (``CallGate``), so that a tool that kills its worker is charged, and the runs
beside it are not (``worker.leases.LeasedRuns._charge_for_lapse``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from hermes_agent.pipeline.journal import CallKey, JournaledCall
from hermes_agent.types import (
    Completion,
    Message,
    ModelResponse,
    ParseError,
    ToolCall,
    Usage,
)
from hermes_agent.worker.attempt import Attempt
from hermes_agent.worker.leases import STRIKES_KEY
from hermes_agent.worker.store import RunStore

RENEWALS = 3
"""How many times a call about to start asks the store again for its lease when the store
answered late, before the attempt gives up."""


class CallGate:
    """The tool calls in progress in one worker process (all its runs share one event loop).

    Calls of ordinary runs run side by side. A run whose calls must run alone (``alone``: it
    was inside a call when a worker died beside another run's call) waits until no other
    run's call is in progress and keeps new ones out until its own end; ``contended`` tells
    the others to write their outcomes at once, so that it does not wait for a later turn.
    A call is in progress from before its intent is written until its outcome is. Holders
    (attempts) are told apart by identity."""

    def __init__(self) -> None:
        self._held: dict[int, int] = {}
        self._alone: int | None = None
        self._waiting_alone = 0
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def contended(self) -> bool:
        return self._waiting_alone > 0

    async def enter(self, holder: object, *, alone: bool) -> None:
        me = id(holder)
        if alone:
            self._waiting_alone += 1
        try:
            while not self._free(me, alone):
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter
        finally:
            if alone:
                self._waiting_alone -= 1
                self._wake()
        self._held[me] = self._held.get(me, 0) + 1
        if alone:
            self._alone = me

    def leave(self, holder: object, count: int = 1) -> None:
        me = id(holder)
        if count <= 0 or me not in self._held:
            return
        left = self._held[me] - count
        if left > 0:
            self._held[me] = left
        else:
            del self._held[me]
            if self._alone == me:
                self._alone = None
        self._wake()

    def leave_all(self, holder: object) -> None:
        self.leave(holder, self._held.get(id(holder), 0))

    def _free(self, me: int, alone: bool) -> bool:
        if self._alone is not None and self._alone != me:
            return False
        if alone:
            return all(other == me for other in self._held)
        # Behind a call waiting to run alone, unless this run is in a call already (its
        # outcome may wait for this one: it must not wait for it in turn).
        return me in self._held or not self._waiting_alone

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class StoreJournal:
    """The journal of one attempt of one run (``attempt.token`` is its fencing token).

    ``entries``: what earlier attempts left, when the caller has read it already (``{}`` on a
    run's first claim: nothing to read); ``None`` reads it here. ``resumes``: ``False`` on a
    run's first claim, which has no trail of earlier attempts to read either."""

    def __init__(
        self,
        store: RunStore,
        request_id: str,
        token: int,
        attempt: Attempt | None = None,
        *,
        entries: dict[str, tuple[str, Any]] | None = None,
        resumes: bool = True,
        gate: CallGate | None = None,
    ) -> None:
        self.resumes = resumes
        self.attempt = attempt or Attempt(store, request_id, token, lease_ttl=30.0)
        attempt = self.attempt
        self.store: RunStore = attempt.store
        self.request_id = attempt.request_id
        self.token = attempt.token
        self.latest_turn = -1
        """The latest model request of this attempt (approvals are keyed by it)."""
        if entries is None:
            entries = attempt.write(
                f"the journal of run {self.request_id}", self.store.journal_entries, self.request_id
            )
        self._entries = entries
        self.gate = gate
        strikes = entries.get(STRIKES_KEY)
        self.alone = strikes is not None and int(strikes[1].get("n", 0)) > 0
        """Its calls run alone in their process (``CallGate``)."""
        self._settled = 0  # calls finished whose outcome waits for the next transaction
        self._idempotent: dict[str, bool] = {}
        self._writing = asyncio.Lock()
        self.replayed_turns = 0
        self.replayed_calls = 0
        self.interrupted_calls = 0

    @property
    def fencing_token(self) -> int:
        """This attempt's fencing token (``current_call().fencing_token`` in its tools)."""
        return self.token

    @property
    def lost(self) -> bool:
        return self.attempt.lost

    @lost.setter
    def lost(self, value: bool) -> None:
        self.attempt.lost = value

    async def recorded_turn(self, turn: int) -> ModelResponse | None:
        self.attempt.alive()  # an attempt that gave up asks the model nothing more
        self.latest_turn = turn
        found = self._entries.get(f"turn/{turn}")
        if found is None:
            return None
        self.replayed_turns += 1
        return response_from_json(found[1])

    async def record_turn(self, turn: int, response: ModelResponse) -> None:
        self.attempt.alive()
        self.attempt.add_entry(f"turn/{turn}", "done", response_to_json(response))

    def recorded_call(self, key: CallKey) -> bool:
        found = self._entries.get(f"call/{key.step}/{key.index}")
        return found is not None and found[0] == "done"

    async def call_started(
        self, key: CallKey, tool: str, arguments: dict[str, Any], idempotent: bool
    ) -> JournaledCall | None:
        name = f"call/{key.step}/{key.index}"
        found = self._entries.get(name)
        if found is not None:
            state, payload = found
            if state == "done":
                self.replayed_calls += 1
                return JournaledCall(
                    "recorded",
                    payload.get("value"),
                    int(payload.get("status_code", 200)),
                    payload.get("error"),
                )
            if not idempotent:
                self.interrupted_calls += 1
                return JournaledCall("interrupted", status_code=500)
        self._idempotent[name] = idempotent
        if self.gate is not None:
            await self.gate.enter(self.attempt, alone=self.alone)
        try:
            self.attempt.add_entry(name, "started", {"tool": tool, "arguments": arguments})
            sent = time.monotonic()
            # One transaction: the fence, the intent, and the lease extended from when the
            # store runs it (never later than that: counted from the send).
            await self.commit(together=True)
            self.attempt.beat(sent)
            await self._lease_for(f"tool call {name} ({tool})")
        except BaseException:
            if self.gate is not None:
                self.gate.leave(self.attempt)
            raise
        return None

    async def _lease_for(self, what: str) -> None:
        """Right before ``what`` starts: the latest write that extended the lease must have
        been sent less than a lease ago. A store that answered later than that (it paused)
        may have let the lease run out meanwhile, but nobody took the run over while the
        token still matches: the lease is extended again (a heartbeat now), and the call
        starts if that comes back in time. A process that froze after this check is the
        tool's own fence's to catch (``hermes_agent.worker.fence``)."""
        attempt = self.attempt
        for _ in range(RENEWALS):
            if time.monotonic() - attempt.last_beat < attempt.lease_ttl:
                break
            sent = time.monotonic()
            alive = await asyncio.to_thread(
                attempt.write,
                f"the lease of run {self.request_id}",
                self.store.heartbeat,
                self.request_id,
                self.token,
                attempt.lease_ttl,
            )
            if not alive:
                attempt.lost = True
                raise asyncio.CancelledError
            attempt.beat(sent)
        attempt.check_lease(what)

    async def call_finished(
        self, key: CallKey, value: Any, status_code: int, error: str | None
    ) -> None:
        name = f"call/{key.step}/{key.index}"
        self.attempt.add_entry(
            name, "done", {"value": value, "status_code": status_code, "error": error}
        )
        self._settled += 1  # in progress for the gate until its outcome is written
        contended = self.gate is not None and self.gate.contended
        if not self._idempotent.get(name, False) or self.alone or contended:
            await self.commit()

    async def save_turn(self, session_id: str, messages: Sequence[Message]) -> None:
        """Kept back: the worker saves the turn with the run's ending (``RunStore.finish``),
        so a run that fails, times out or is cancelled adds nothing to its session."""
        self.attempt.alive()
        self.attempt.turn = list(messages)

    def holds(self) -> bool:
        return self.attempt.holds()

    async def commit(self, *, together: bool = False) -> None:
        """Write the attempt's batch in one fenced transaction, in a thread (one slow write
        stalls no other run of the worker). ``together``: first let the other calls of this
        model turn that start at the same moment add their intents, so that they share it.
        A batch that holds intents extends the lease in the same transaction.

        An attempt that lost the run stops here, whatever stage it is in (a cancellation,
        which no stage turns into a result); one whose store stayed away raises
        ``StoreUnavailable``, which no stage turns into one either."""
        if together:
            await asyncio.sleep(0)
        async with self._writing:
            self.attempt.alive()  # a batch before this one failed: nothing more is written
            settled, self._settled = self._settled, 0
            batch = self.attempt.take()
            if batch:
                intents = any(state == "started" for state, _ in batch.entries.values())
                await asyncio.to_thread(
                    self.attempt.write,
                    f"the journal of run {self.request_id}",
                    self.store.write_batch,
                    self.request_id,
                    self.token,
                    batch,
                    renew=self.attempt.lease_ttl if intents else None,
                )
            if self.gate is not None:
                self.gate.leave(self.attempt, settled)


def response_to_json(response: ModelResponse) -> dict[str, Any]:
    completion = response.completion
    return {
        "text": response.text,
        "model_name": response.model_name,
        "finish_reason": response.finish_reason,
        "usage": {
            "prompt_tokens": response.usage.prompt_tokens,
            "completion_tokens": response.usage.completion_tokens,
            "requests": response.usage.requests,
        },
        "content": completion.content,
        "scratch_pad": completion.scratch_pad,
        "thought": completion.thought,
        "notes": list(completion.notes),
        "tool_calls": [
            {"name": c.name, "arguments": c.arguments, "id": c.id, "text": c.text_arguments}
            for c in completion.tool_calls
        ],
        # The calls written inside the thought: the thought policy decides again on resume.
        "thought_calls": [
            {"name": c.name, "arguments": c.arguments, "id": c.id, "text": c.text_arguments}
            for c in completion.thought_calls
        ],
        "errors": [{"block": e.block, "message": e.message} for e in completion.errors],
    }


def response_from_json(data: dict[str, Any]) -> ModelResponse:
    completion = Completion(
        content=data.get("content", ""),
        tool_calls=[
            # "text": the values are untyped text (XML calls), typed again by the schema.
            ToolCall(c["name"], c["arguments"], c["id"], bool(c.get("text", False)))
            for c in data["tool_calls"]
        ],
        scratch_pad=data.get("scratch_pad"),
        thought=data.get("thought"),
        notes=list(data.get("notes") or []),
        errors=[ParseError(e["block"], e["message"]) for e in data["errors"]],
        thought_calls=[
            ToolCall(c["name"], c["arguments"], c["id"], bool(c.get("text", False)))
            for c in data.get("thought_calls") or []
        ],
    )
    usage = Usage(**data.get("usage", {}))
    return ModelResponse(
        completion,
        data["text"],
        usage,
        data.get("model_name", ""),
        str(data.get("finish_reason") or ""),
    )
