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

A tool asks the caller's model for a completion the same way (MCP sampling): ``await
sample_caller("Summarise: ...", max_tokens=200)`` is the text the caller's client produced
(``None`` when it refused), and ``await list_caller_roots()`` the caller's roots; each needs
its client to have declared ``sampling`` or ``roots``, as a question needs ``elicitation``.

Only an MCP caller can answer (``hermes-agent mcp serve``): on a session of 2025-11-25 or
before, by an elicitation request sent to its client while the call waits; at 2026-07-28
(stateless: no session to send a request on), the call's result is ``input_required`` with the
question, and the client's retry carries the answer, the call waiting in between. A caller
whose client declared no elicitation (no sampling, no roots: whichever the request needs), and
every other door (a run of the agent's own model, the
REST service, a channel), cannot answer: ``ask_caller`` raises ``CallerCannotAnswer``, which
the tool may catch. The approvals the agent needs are asked the same way (``AgentMcpServer``).

The asker is found in the context the call runs in: an ``async`` tool asks directly; a sync tool
on its thread, or a ``subprocess`` tool, cannot ask (its ``ask_caller`` has no loop to wait on).
Importing this module imports nothing of the SDK.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from hermes_agent.errors import HermesAgentError
from hermes_agent.tools.runtime import asked_caller

if TYPE_CHECKING:
    from pydantic import TypeAdapter

Action = Literal["accept", "decline", "cancel"]
Capability = Literal["elicitation", "sampling", "roots"]
"""What a client declares it can answer (a request of each needs its own)."""


class CallerCannotAnswer(HermesAgentError):
    """Nobody who called this tool can be asked for input (no MCP caller, or one whose client
    declared no elicitation, or no sampling or roots for those). ``capability``: the one
    that was missing."""

    def __init__(self, message: str, capability: Capability = "elicitation") -> None:
        super().__init__(message)
        self.capability: Capability = capability


@dataclass(frozen=True, slots=True)
class Question:
    """What a tool asks: a ``message`` and the form of the answer (``schema``, the restricted
    JSON Schema an MCP elicitation takes: an object of flat fields). ``key`` names the question
    where several are asked (the key of its input request at 2026-07-28)."""

    message: str
    schema: dict[str, Any]
    key: str = "input"
    capability: ClassVar[Capability] = "elicitation"

    def request(self) -> tuple[str, dict[str, Any]]:
        """The request's method and params, as MCP writes them."""
        params = {"mode": "form", "message": self.message, "requestedSchema": self.schema}
        return "elicitation/create", params

    def read(self, response: Mapping[str, Any]) -> Answer | None:
        """The client's result as an ``Answer`` (``None`` when it is not one)."""
        action, content = response.get("action"), response.get("content", {})
        if action not in ("accept", "decline", "cancel"):
            return None
        if action != "accept":
            return Answer(action)
        return Answer("accept", dict(content)) if isinstance(content, Mapping) else None


@dataclass(frozen=True, slots=True)
class Sampling:
    """A completion asked of the caller's model (``sampling/createMessage``): ``messages``
    as MCP's sampling messages (``{"role", "content"}``, the content a block or a list of
    blocks), at most ``max_tokens``, with an optional ``system`` prompt. Answered with the
    client's ``CreateMessageResult`` as the content (``role``, ``content``, ``model``,
    ``stopReason``)."""

    messages: tuple[dict[str, Any], ...]
    max_tokens: int
    system: str | None = None
    key: str = "sampling"
    capability: ClassVar[Capability] = "sampling"

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(f"max_tokens must be an int, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")

    def request(self) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = {"messages": list(self.messages), "maxTokens": self.max_tokens}
        if self.system is not None:
            params["systemPrompt"] = self.system
        return "sampling/createMessage", params

    def read(self, response: Mapping[str, Any]) -> Answer | None:
        if "content" not in response or "role" not in response or "model" not in response:
            return None
        return Answer("accept", dict(response))


@dataclass(frozen=True, slots=True)
class Roots:
    """The caller's roots, asked of its client (``roots/list``); answered with
    ``{"roots": [{"uri", "name"?}, ...]}``."""

    key: str = "roots"
    capability: ClassVar[Capability] = "roots"

    def request(self) -> tuple[str, dict[str, Any]]:
        return "roots/list", {}

    def read(self, response: Mapping[str, Any]) -> Answer | None:
        roots = response.get("roots")
        if not isinstance(roots, list):
            return None
        return Answer("accept", {"roots": roots})


Request = Question | Sampling | Roots
"""Whatever a tool can ask its caller."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The caller's answer: ``accept`` with ``content`` (the form's fields), or ``decline`` or
    ``cancel`` without."""

    action: Action
    content: dict[str, Any] = field(default_factory=dict)


Asker = Callable[[Request], Awaitable[Answer]]
"""Puts one request to the caller and waits for the answer (the MCP server's, per call)."""


@dataclass(slots=True)
class Caller:
    """Who a call's requests go to: its ``asker`` and the ``capabilities`` its client
    declared. ``refusal``: the last ``CallerCannotAnswer`` raised to the call's tool."""

    asker: Asker | None
    capabilities: frozenset[Capability] = frozenset()
    refusal: CallerCannotAnswer | None = None


_caller: ContextVar[Caller | None] = ContextVar("hermes_agent_mcp_caller", default=None)


async def ask_caller(
    message: str, schema: dict[str, Any], *, key: str = "input"
) -> dict[str, Any] | None:
    """Ask the caller of the running tool for input and wait for the answer: the form's fields
    when the caller accepts, ``None`` when it declines or cancels. ``CallerCannotAnswer`` when
    nobody can be asked (see the module's documentation)."""
    answer = await ask(Question(message, schema, key))
    return answer.content if answer.action == "accept" else None


async def sample_caller(
    messages: str | Sequence[dict[str, Any]],
    *,
    max_tokens: int,
    system: str | None = None,
    key: str = "sampling",
) -> str | None:
    """Ask the caller's model for a completion and wait for it: its text (the text blocks of
    the reply, joined), ``None`` when the caller refused. ``messages`` is a prompt (one user
    message) or MCP sampling messages. ``CallerCannotAnswer`` when nobody can be asked."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": {"type": "text", "text": messages}}]
    answer = await ask(Sampling(tuple(messages), max_tokens, system, key))
    if answer.action != "accept":
        return None
    content = answer.content.get("content")
    blocks = content if isinstance(content, list) else [content]
    return "".join(
        str(b.get("text", "")) for b in blocks if isinstance(b, Mapping) and b.get("type") == "text"
    )


async def list_caller_roots(*, key: str = "roots") -> list[dict[str, Any]]:
    """The caller's roots (``{"uri", "name"?}`` each); ``[]`` when it gave none.
    ``CallerCannotAnswer`` when nobody can be asked."""
    answer = await ask(Roots(key))
    return list(answer.content.get("roots", [])) if answer.action == "accept" else []


async def ask(request: Request) -> Answer:
    """Put any request to the caller; the whole answer (its action too). ``ValueError`` for
    a request the protocol cannot carry (checked before anyone is asked, at every revision)."""
    caller = _caller.get()
    needed = request.capability
    asked_caller()  # whatever the call returns now depends on who called: never cached
    if caller is None or caller.asker is None or needed not in caller.capabilities:
        refusal = CallerCannotAnswer(
            f"nobody can be asked for this here: only an MCP caller whose client declared "
            f"{needed} can answer",
            needed,
        )
        if caller is not None:
            caller.refusal = refusal
        raise refusal
    _check(request)
    return await caller.asker(request)


def _check(request: Request) -> None:
    """``ValueError`` unless ``request`` is one the protocol can carry (the SDK's model)."""
    from pydantic import ValidationError

    method, params = request.request()
    try:
        _input_request().validate_python({"method": method, "params": params})
    except ValidationError as exc:
        raise ValueError(f"{method}: not a request MCP can carry: {exc}") from None


@functools.cache
def _input_request() -> TypeAdapter[Any]:
    from mcp.types import InputRequest
    from pydantic import TypeAdapter

    return TypeAdapter(InputRequest)


def can_ask(capability: Capability = "elicitation") -> bool:
    """Whether a caller can be asked from this context (a request needing ``capability``)."""
    caller = _caller.get()
    return caller is not None and caller.asker is not None and capability in caller.capabilities


def asking(caller: Caller | None) -> Token[Caller | None]:
    """Make ``caller`` answer the requests made from this context on; ``stop_asking`` with
    the token it returns."""
    return _caller.set(caller)


def stop_asking(token: Token[Caller | None]) -> None:
    _caller.reset(token)
