"""A run's journal in the store (``pipeline.journal.RunJournal``), fenced by the worker's lease.

Keys: ``turn/<n>`` for the n-th model request of the run, ``call/<step>/<index>`` for a tool
call. A call is written ``started`` (with its arguments) before the tool runs and ``done``
(with its outcome) after; a model turn is written ``done`` as soon as it arrives. Every write
checks the run's fencing token in the same transaction, so a worker whose lease passed to
another writes nothing more (``LeaseLost``) and the run stops there; a store that fails is
tried again for a while, then the attempt ends (``StoreUnavailable``; ``worker.attempt``).
Right before a tool call starts, the attempt checks that its lease is still its own
(``Attempt.check_lease``). The session turn is kept back and saved with the run's ending.
"""

from __future__ import annotations

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
    """The journal of one attempt of one run (``attempt.token`` is its fencing token)."""

    def __init__(
        self, store: RunStore, request_id: str, token: int, attempt: Attempt | None = None
    ) -> None:
        self.attempt = attempt or Attempt(store, request_id, token, lease_ttl=30.0)
        attempt = self.attempt
        self.store: RunStore = attempt.store
        self.request_id = attempt.request_id
        self.token = attempt.token
        self.latest_turn = -1
        """The latest model request of this attempt (approvals are keyed by it)."""
        # What earlier attempts left.
        self._entries = attempt.write(
            f"the journal of run {self.request_id}", self.store.journal_entries, self.request_id
        )
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
        self._write(
            self.store.write_journal,
            self.request_id,
            self.token,
            f"turn/{turn}",
            "done",
            response_to_json(response),
        )

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
        self._write(
            self.store.write_journal,
            self.request_id,
            self.token,
            name,
            "started",
            {"tool": tool, "arguments": arguments},
        )
        # The fence on the tool itself: the write above proved the lease at that moment; the
        # local deadline covers a process that froze or a store that stalled since.
        self.attempt.check_lease(f"tool call {name} ({tool})")
        return None

    async def call_finished(
        self, key: CallKey, value: Any, status_code: int, error: str | None
    ) -> None:
        self._write(
            self.store.write_journal,
            self.request_id,
            self.token,
            f"call/{key.step}/{key.index}",
            "done",
            {"value": value, "status_code": status_code, "error": error},
        )

    async def save_turn(self, session_id: str, messages: Sequence[Message]) -> None:
        """Kept back: the worker saves the turn with the run's ending (``RunStore.finish``),
        so a run that fails, times out or is cancelled adds nothing to its session."""
        self.attempt.alive()
        self.attempt.turn = list(messages)

    def holds(self) -> bool:
        return self.attempt.holds()

    def _write(self, write: Any, *args: Any) -> None:
        """A fenced write (``Attempt.write``): an attempt that lost the run stops here,
        whatever stage it is in (a cancellation, which no stage turns into a result); one
        whose store stayed away raises ``StoreUnavailable``, which no stage turns into one
        either."""
        self.attempt.write(f"the journal of run {self.request_id}", write, *args)


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
