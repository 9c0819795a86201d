"""Durable runs: the seam through which a run's model turns and tool calls are journaled.

A run given a ``RunJournal`` (``Agent.arun(..., journal=...)``; the queue workers do this) asks
the journal before each model request and each tool call whether it already happened in an
earlier attempt of the same run:

- a model turn the journal holds is taken from it — the model is not asked again;
- a tool call whose result the journal holds gets that result — the tool does not run again;
- a tool call that started and never finished (its process died) is reported to the model as
  interrupted, unless the tool is declared ``idempotent``, in which case it runs again.

So a run killed anywhere resumes where it stopped, and a tool with side effects runs at most
once per call id. The journal records the intent of a call before the tool runs and its outcome
after, and each model turn as soon as it arrives; what makes the record durable (and fenced
against a second copy of the run) is the journal's business (``worker.journal``): a journal
that finds its attempt has lost the run cancels the run (``asyncio.CancelledError``), so
nothing more happens in it.

Every tool call has a stable id, ``CallKey`` (request, step, position in the model's turn),
which the tool itself can read with ``current_call()`` — an idempotency key to pass on to the
system the tool changes::

    @agent.tool
    def charge(customer: str, cents: int) -> str:
        key = current_call()
        return payments.charge(customer, cents, idempotency_key=key.id if key else None)

A durable run's journal also has a fencing token (``FencedJournal``): it grows with each
attempt, and ``current_call().fencing_token`` hands it to the tool, so that the system the tool
changes can refuse a write from an attempt older than the newest it has seen (a process that
froze mid-call and woke after its run was taken over).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from hermes_agent.models.base import Model, ModelProfile, ModelSettings
from hermes_agent.types import Message, ModelResponse, StreamChunk


@dataclass(frozen=True, slots=True)
class CallKey:
    """The stable id of one tool call: the same in every attempt of a run."""

    request_id: str
    step: int
    index: int
    """The call's position in the model's turn."""
    fencing_token: int | None = field(default=None, compare=False)
    """The fencing token of the attempt making the call (a durable run; ``None`` otherwise):
    higher in every later attempt. A tool passes it to the system it changes, which refuses
    a write carrying a lower token than one it has seen for the same run (docs/scale-out.md,
    "What is fenced")."""

    @property
    def id(self) -> str:
        return f"{self.request_id}/{self.step}/{self.index}"


_CURRENT_CALL: ContextVar[CallKey | None] = ContextVar("hermes_current_call", default=None)


def current_call() -> CallKey | None:
    """The stable id of the tool call running now (``None`` outside a tool call). Set for
    ``in_process``, ``inline`` and async tools; a ``subprocess`` tool runs in another process
    and does not see it."""
    return _CURRENT_CALL.get()


def set_current_call(key: CallKey | None) -> Any:
    """Make ``key`` the current call (the ToolExecutor does this); returns the reset token."""
    return _CURRENT_CALL.set(key)


def reset_current_call(token: Any) -> None:
    _CURRENT_CALL.reset(token)


JournalKind = Literal["recorded", "interrupted"]


@dataclass(slots=True)
class JournaledCall:
    """What the journal knows of a call from an earlier attempt: its recorded outcome, or that
    it started and never finished (``interrupted``)."""

    kind: JournalKind
    value: Any = None
    status_code: int = 200
    error: str | None = None


class RunJournal(Protocol):
    """Where a durable run keeps its model turns and tool calls (see the module docstring).

    Turns are numbered in the order the run asks for them (summaries included), from 0."""

    @property
    def resumes(self) -> bool:
        """Whether an earlier attempt of this run may have left a trail (``False`` on a run's
        first attempt: the agent then reads nothing of the trail back before it starts)."""
        ...

    async def recorded_turn(self, turn: int) -> ModelResponse | None:
        """The model's answer to request ``turn`` in an earlier attempt, if it was kept."""
        ...

    async def record_turn(self, turn: int, response: ModelResponse) -> None:
        """Keep the model's answer to request ``turn`` before the run acts on it."""
        ...

    def recorded_call(self, key: CallKey) -> bool:
        """Whether the call's outcome is journaled (it ran in an earlier attempt): the
        ToolSelector then does not refuse it for being unavailable or over its rate limit now,
        since it is not run again."""
        ...

    async def call_started(
        self, key: CallKey, tool: str, arguments: dict[str, Any], idempotent: bool
    ) -> JournaledCall | None:
        """Before a call runs: ``None`` means run it (its intent is now recorded); otherwise
        what to report instead (the recorded outcome, or that it was interrupted). An
        ``idempotent`` call that was interrupted is run again (``None``)."""
        ...

    async def call_finished(
        self, key: CallKey, value: Any, status_code: int, error: str | None
    ) -> None:
        """After a call ran: keep its outcome (the raw value, before truncation)."""
        ...

    async def save_turn(self, session_id: str, messages: Sequence[Message]) -> None:
        """Add the run's messages to the session and mark the run done, as one step (so a run
        killed in between can neither lose its turn nor save it twice)."""
        ...

    def holds(self) -> bool:
        """Whether this attempt still owns the run. One that lost it (another worker took the
        run over) leaves the trail to the new owner: its unfinished step is not recorded."""
        ...


@runtime_checkable
class FencedJournal(Protocol):
    """A journal whose run is held by one attempt at a time (the queue's): each attempt has
    a fencing token, which the ToolExecutor hands to tools in ``current_call()``."""

    @property
    def fencing_token(self) -> int: ...


class JournaledModel:
    """A model whose answers go through a journal: a request the journal answered in an
    earlier attempt is not sent again. Both models of a run share one turn counter."""

    def __init__(self, inner: Model, journal: RunJournal, counter: list[int]) -> None:
        self.inner = inner
        self.name = inner.name
        self._journal = journal
        self._counter = counter

    @property
    def profile(self) -> ModelProfile:
        return self.inner.profile

    def render_prompt(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], settings: ModelSettings
    ) -> str:
        return self.inner.render_prompt(messages, tools, settings)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def _next_turn(self) -> int:
        turn = self._counter[0]
        self._counter[0] += 1
        return turn

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], settings: ModelSettings
    ) -> ModelResponse:
        turn = self._next_turn()
        recorded = await self._journal.recorded_turn(turn)
        if recorded is not None:
            return recorded
        response = await self.inner.complete(messages, tools, settings)
        await self._journal.record_turn(turn, response)
        return response

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], settings: ModelSettings
    ) -> AsyncIterator[StreamChunk]:
        turn = self._next_turn()
        recorded = await self._journal.recorded_turn(turn)
        if recorded is not None:
            yield StreamChunk(recorded.text, recorded.usage, recorded.finish_reason)
            return
        from hermes_agent.protocol.parser import parse_completion

        parts: list[str] = []
        usage = None
        finish = ""
        async for chunk in self.inner.stream(messages, tools, settings):
            parts.append(chunk.text)
            usage = chunk.usage or usage
            finish = chunk.finish_reason or finish
            yield chunk
        text = "".join(parts)
        response = ModelResponse(
            parse_completion(text), text, model_name=self.name, finish_reason=finish
        )
        if usage is not None:
            response.usage = usage
        await self._journal.record_turn(turn, response)


def journaled(
    journal: RunJournal, model: Model, answer_model: Model | None
) -> tuple[Model, Model | None]:
    """The run's models with their requests going through ``journal`` (one shared counter; the
    same model object stays one object, which routing relies on)."""
    counter = [0]
    wrapped = JournaledModel(model, journal, counter)
    if answer_model is None:
        return wrapped, None
    if answer_model is model:
        return wrapped, wrapped
    return wrapped, JournaledModel(answer_model, journal, counter)
