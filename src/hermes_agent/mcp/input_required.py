"""Input-required results (MCP 2026-07-28): a call that needs its caller's input returns the
question, and the caller's retry brings the answer, while the call waits in this process.

A stateless request has no session to send an elicitation request on. So a call whose caller
declared elicitation, sampling or roots runs as an ``Exchange``: a task of its own, whose
questions (an approval the agent needs, a tool's ``ask_caller``, ``sample_caller`` or
``list_caller_roots``) end the request with ``resultType: input_required``,
the questions as ``inputRequests`` and a ``requestState`` naming the exchange and its round.
The retry (the same tool, the same arguments, ``inputResponses`` and the echoed state) answers
the questions, and the call goes on where it waited: to its result, or to the next questions.

The state is sealed by the SDK's ``RequestStateBoundary`` (AES-GCM under a key of this
process, bound to the method, the tool, its arguments, the caller's principal and this server,
and expiring): a tampered state, another caller's, or one minted by another process is refused
(``-32602``) before anything runs. Here the exchange is also bound to its owner and its round:
a state whose questions were answered already is refused too. A call whose caller does not come
back within the state's lifetime has its questions cancelled (an approval is then denied), so
the run ends and leaves the trail as any run does.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hermes_agent.errors import HermesAgentError
from hermes_agent.mcp.asking import Answer, Request

if TYPE_CHECKING:
    from mcp.types import CallToolResult, InputRequiredResult

STATE_TTL_S = 600.0
"""How long a caller has to answer (the sealed state's lifetime too)."""
_STATE_MARK = "hermes-exchange"


class StateRefused(HermesAgentError):
    """A ``requestState`` this server will not resume from (its message says why); the door
    answers it with JSON-RPC's invalid-params error."""


@dataclass(slots=True)
class _Asked:
    question: Request
    answer: asyncio.Future[Answer]


@dataclass(slots=True)
class Exchange:
    """One call waiting on its caller, between requests."""

    id: str
    owner: str
    task: asyncio.Task[CallToolResult]
    round: int = 0
    asked: dict[str, _Asked] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    expiry: asyncio.TimerHandle | None = None
    on_resume: Callable[[Any], None] | None = None
    """Told the request each retry comes in on (what the call sends goes out on it)."""

    async def ask(self, question: Request) -> Answer:
        """Put ``question`` (any request: a form, a completion, the roots) to the caller, at
        the end of the current request, and wait."""
        key, n = question.key, 1
        while key in self.asked:  # two questions at once under one key: each its own
            n += 1
            key = f"{question.key}_{n}"
        asked = _Asked(question, asyncio.get_running_loop().create_future())
        self.asked[key] = asked
        self.changed.set()
        try:
            return await asked.answer
        finally:
            self.asked.pop(key, None)

    def answer(self, responses: Mapping[str, Any]) -> int:
        """Answer the questions ``responses`` has a valid answer for (others are ignored);
        how many were answered."""
        answered = 0
        for key, asked in list(self.asked.items()):
            answer = _answer(asked.question, responses.get(key))
            if answer is not None and not asked.answer.done():
                asked.answer.set_result(answer)
                answered += 1
        return answered

    def cancel_questions(self) -> None:
        for asked in self.asked.values():
            if not asked.answer.done():
                asked.answer.set_result(Answer("cancel"))


class Exchanges:
    """The calls of one server waiting on their callers."""

    def __init__(self, ttl_s: float = STATE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._open: dict[str, Exchange] = {}

    def __len__(self) -> int:
        return len(self._open)

    async def start(
        self, owner: str, run: Callable[[Exchange], Awaitable[CallToolResult]]
    ) -> CallToolResult | InputRequiredResult:
        """Run a call (``run``, given its exchange to ask through) until it ends or asks."""
        exchange_id = uuid.uuid4().hex
        holder: list[Exchange] = []

        async def main() -> CallToolResult:
            return await run(holder[0])

        exchange = Exchange(exchange_id, owner, asyncio.get_running_loop().create_task(main()))
        holder.append(exchange)
        self._open[exchange_id] = exchange
        exchange.task.add_done_callback(lambda _task: self._done(exchange))
        return await self._advance(exchange)

    async def resume(
        self, owner: str, state: str, responses: Mapping[str, Any] | None, request: Any = None
    ) -> CallToolResult | InputRequiredResult:
        """Answer a waiting call's questions from ``responses`` and go on until it ends or asks
        again. ``StateRefused`` for a state that names no call of ``owner`` waiting now."""
        try:
            decoded = json.loads(state)
            mark, exchange_id, round_ = decoded["m"], decoded["x"], decoded["r"]
        except (ValueError, KeyError, TypeError):
            raise StateRefused("requestState is not one of this server's") from None
        exchange = self._open.get(exchange_id) if mark == _STATE_MARK else None
        if exchange is None or exchange.owner != owner:
            raise StateRefused("requestState names no call waiting for this caller")
        if round_ != exchange.round:
            raise StateRefused("requestState was answered already: retry with the latest one")
        if exchange.answer(responses or {}) == 0:  # nothing answered: ask again
            if all(asked.answer.done() for asked in exchange.asked.values()):
                raise StateRefused("requestState was answered already: retry with the latest one")
            return self._input_required(exchange)
        if exchange.on_resume is not None:
            exchange.on_resume(request)
        return await self._advance(exchange)

    async def _advance(self, exchange: Exchange) -> CallToolResult | InputRequiredResult:
        if exchange.expiry is not None:
            exchange.expiry.cancel()
            exchange.expiry = None
        waiter: asyncio.Task[Any] | None = None
        try:
            while not exchange.task.done():
                pending = [a for a in exchange.asked.values() if not a.answer.done()]
                if pending:
                    return self._input_required(exchange)
                exchange.changed.clear()
                waiter = asyncio.ensure_future(exchange.changed.wait())
                await asyncio.wait({exchange.task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                await asyncio.sleep(0)  # best effort: questions gathered go out together
        except asyncio.CancelledError:  # the caller went away mid-call: so does the call
            exchange.task.cancel()
            raise
        finally:
            if waiter is not None:
                waiter.cancel()
        return exchange.task.result()

    def _input_required(self, exchange: Exchange) -> InputRequiredResult:
        from mcp.types import InputRequiredResult

        exchange.round += 1
        state = json.dumps({"m": _STATE_MARK, "x": exchange.id, "r": exchange.round})
        requests = {
            key: dict(zip(("method", "params"), asked.question.request(), strict=True))
            for key, asked in exchange.asked.items()
            if not asked.answer.done()
        }
        if exchange.expiry is not None:
            exchange.expiry.cancel()
        loop = asyncio.get_running_loop()
        exchange.expiry = loop.call_later(self.ttl_s, self._expire, exchange)
        return InputRequiredResult.model_validate(
            {"resultType": "input_required", "inputRequests": requests, "requestState": state}
        )

    def _expire(self, exchange: Exchange) -> None:
        """Nobody came back: the questions are cancelled and the call ends unheard."""
        self._open.pop(exchange.id, None)
        exchange.cancel_questions()

    def _done(self, exchange: Exchange) -> None:
        self._open.pop(exchange.id, None)
        if exchange.expiry is not None:
            exchange.expiry.cancel()
        if not exchange.task.cancelled():
            exchange.task.exception()  # retrieved: one nobody collects is not logged as lost

    async def close(self) -> None:
        """Cancel every waiting call (the server is stopping)."""
        for exchange in list(self._open.values()):
            exchange.task.cancel()
            with suppress(BaseException):
                await exchange.task


def _answer(question: Request, response: Any) -> Answer | None:
    """The client's result for ``question`` (an elicitation's, a completion, the roots) as an
    ``Answer``; ``None`` when it is not one."""
    if hasattr(response, "model_dump"):
        response = response.model_dump(by_alias=True, exclude_none=True, mode="json")
    if not isinstance(response, Mapping):
        return None
    return question.read(response)
