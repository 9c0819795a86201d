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
not written is done again by the attempt that resumes the run. Right before a tool call
starts, the attempt checks that its lease is still its own (``Attempt.check_lease``). The
session turn is kept back and saved with the run's ending.
"""

from __future__ import annotations

import asyncio
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
from hermes_agent.worker.store import RunStore


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
        self.attempt.add_entry(name, "started", {"tool": tool, "arguments": arguments})
        await self.commit(together=True)
        # The fence on the tool itself: the write above proved the lease at that moment; the
        # local deadline covers a process that froze or a store that stalled since.
        self.attempt.check_lease(f"tool call {name} ({tool})")
        return None

    async def call_finished(
        self, key: CallKey, value: Any, status_code: int, error: str | None
    ) -> None:
        name = f"call/{key.step}/{key.index}"
        self.attempt.add_entry(
            name, "done", {"value": value, "status_code": status_code, "error": error}
        )
        if not self._idempotent.get(name, False):
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

        An attempt that lost the run stops here, whatever stage it is in (a cancellation,
        which no stage turns into a result); one whose store stayed away raises
        ``StoreUnavailable``, which no stage turns into one either."""
        if together:
            await asyncio.sleep(0)
        async with self._writing:
            self.attempt.alive()  # a batch before this one failed: nothing more is written
            batch = self.attempt.take()
            if not batch:
                return
            await asyncio.to_thread(
                self.attempt.write,
                f"the journal of run {self.request_id}",
                self.store.write_batch,
                self.request_id,
                self.token,
                batch,
            )


def response_to_json(response: ModelResponse) -> dict[str, Any]:
    completion = response.completion
    return {
        "text": response.text,
        "model_name": response.model_name,
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
    )
    usage = Usage(**data.get("usage", {}))
    return ModelResponse(completion, data["text"], usage, data.get("model_name", ""))
