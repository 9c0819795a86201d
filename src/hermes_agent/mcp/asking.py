"""A tool asks the caller who called it for input, while it runs.

    from hermes_agent import tool
    from hermes_agent.mcp import CallerCannotAnswer, ask_caller

    @tool
    async def book_meeting(topic: str) -> str:
        "Book a meeting about a topic."
        form = {"type": "object", "properties": {"day": {"type": "string"}}, "required": ["day"]}
        try:
            answer = await ask_caller("Which day suits you?", form, key="day")
        except CallerCannotAnswer:
            return "nobody could be asked for a day: booked nothing"
        if answer is None:
            return "the caller declined: booked nothing"
        return f"booked {topic} on {answer['day']}"

Only an MCP caller can answer (``hermes-agent mcp serve``): on a session of 2025-11-25 or
before, by an elicitation request sent to its client while the call waits; at 2026-07-28
(stateless: no session to send a request on), the call's result is ``input_required`` with the
question, and the client's retry carries the answer, the call waiting in between. A caller
whose client declared no elicitation, and every other door (a run of the agent's own model, the
REST service, a channel), cannot answer: ``ask_caller`` raises ``CallerCannotAnswer``, which
the tool may catch. The approvals the agent needs are asked the same way (``AgentMcpServer``).

The asker is found in the context the call runs in: an ``async`` tool asks directly; a sync tool
on its thread, or a ``subprocess`` tool, cannot ask (its ``ask_caller`` has no loop to wait on).
Importing this module imports nothing of the SDK.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, Literal

from hermes_agent.errors import HermesAgentError

Action = Literal["accept", "decline", "cancel"]


class CallerCannotAnswer(HermesAgentError):
    """Nobody who called this tool can be asked for input (no MCP caller, or one whose client
    declared no elicitation)."""


@dataclass(frozen=True, slots=True)
class Question:
    """What a tool asks: a ``message`` and the form of the answer (``schema``, the restricted
    JSON Schema an MCP elicitation takes: an object of flat fields). ``key`` names the question
    where several are asked (the key of its input request at 2026-07-28)."""

    message: str
    schema: dict[str, Any]
    key: str = "input"


@dataclass(frozen=True, slots=True)
class Answer:
    """The caller's answer: ``accept`` with ``content`` (the form's fields), or ``decline`` or
    ``cancel`` without."""

    action: Action
    content: dict[str, Any] = field(default_factory=dict)


Asker = Callable[[Question], Awaitable[Answer]]
"""Puts one question to the caller and waits for the answer (the MCP server's, per call)."""

_asker: ContextVar[Asker | None] = ContextVar("hermes_agent_mcp_asker", default=None)


async def ask_caller(
    message: str, schema: dict[str, Any], *, key: str = "input"
) -> dict[str, Any] | None:
    """Ask the caller of the running tool for input and wait for the answer: the form's fields
    when the caller accepts, ``None`` when it declines or cancels. ``CallerCannotAnswer`` when
    nobody can be asked (see the module's documentation)."""
    answer = await ask(Question(message, schema, key))
    return answer.content if answer.action == "accept" else None


async def ask(question: Question) -> Answer:
    """``ask_caller`` with the whole answer (its action too)."""
    asker = _asker.get()
    if asker is None:
        raise CallerCannotAnswer(
            "nobody can be asked for input here: only an MCP caller whose client declared "
            "elicitation can answer"
        )
    return await asker(question)


def can_ask() -> bool:
    """Whether a caller can be asked from this context."""
    return _asker.get() is not None


def asking(asker: Asker | None) -> Token[Asker | None]:
    """Make ``asker`` answer the questions asked from this context on; ``stop_asking`` with the
    token it returns."""
    return _asker.set(asker)


def stop_asking(token: Token[Asker | None]) -> None:
    _asker.reset(token)
