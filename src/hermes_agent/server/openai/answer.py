"""What the facade answers for a run, the same for ``/v1/chat/completions`` and
``/v1/responses``: the answer's text as it streams (``AnswerText``, followed by
``answer_pieces``), the notice of an approval that waits, the token usage in each API's shape,
and the ``hermes`` extension field (what ran server-side). Each API's routes put these in their
own frames (``server.openai.chat``, ``server.openai.responses``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any, Literal, NamedTuple

from hermes_agent.events import OutputEvent, TextDeltaEvent, ThoughtEvent, ToolCallStartedEvent
from hermes_agent.runs.backend import RunBackend, RunView
from hermes_agent.runs.events import ApprovalRequiredEvent, RunEvent, read_known
from hermes_agent.runs.principal import Principal
from hermes_agent.server.openai.tools import ran_here


def usage(result: dict[str, Any] | None, api: Literal["chat", "responses"]) -> dict[str, Any]:
    """A run's tokens as ``usage``, in the shape of the chat API or of the Responses API."""
    counted = (result or {}).get("usage") or {}
    prompt = int(counted.get("prompt_tokens", 0))
    completion = int(counted.get("completion_tokens", 0))
    if api == "chat":
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def extension(run: RunView, notes: Sequence[str] = ()) -> dict[str, Any]:
    """The ``hermes`` field: the run, and what ran server-side; ``notes`` are the facade's
    own warnings, after the run's."""
    result = run.result or {}
    return {
        "request_id": run.request_id,
        "session_id": run.session_id,
        "status": run.status,
        "tool_calls": [
            {
                "id": call.get("id", ""),
                "name": call["name"],
                "arguments": call["arguments"],
                "result": call.get("result"),
                "status_code": call.get("status_code"),
                "error": call.get("error"),
            }
            for call in ran_here(result)
        ],
        "approvals": result.get("approvals", []),
        "pending_approvals": run.pending_approvals,
        "warnings": [*result.get("warnings", []), *notes],
    }


def approval_notice(pending: dict[str, Any], *, streaming: bool) -> str:
    """What the answer says about a tool call that waits for approval."""
    after = (
        "This answer goes on once it is answered."
        if streaming
        else "The run goes on once it is answered; its answer: "
        f"GET /v1/runs/{pending['request_id']}."
    )
    return (
        f"The agent wants to run the tool {pending['tool']!r} with "
        f"{json.dumps(pending['arguments'], ensure_ascii=False)} and needs your approval. "
        f"Answer with POST /v1/approvals/{pending['approval_id']} "
        f'{{"approved": true}} (or false) before {pending["expires"]}. {after}'
    )


class AnswerText:
    """Turns a run's text deltas into the answer's content as it streams.

    A turn that calls a tool is not the answer: its text is held back while it is only
    whitespace (the common case: a call on its own), and nothing after its first call is sent.
    Leading and trailing whitespace is held back (the answer is stripped); turns that both
    said something are separated by a blank line. ``finish`` sends whatever the final answer
    has that was not streamed (an answer from a model that did not stream, the note about an
    iteration limit), so that for a run whose tool turns say nothing but their calls, the
    streamed content is exactly the plain answer's.

    ``structured`` (the request asked for a JSON answer): only the validated value is sent,
    once the run has it (its final answer with status 200). The model's text on the way may
    be an answer that fails the schema and is asked again, or an account of why there is
    none; either, streamed, would be taken for the JSON."""

    def __init__(self, *, structured: bool = False) -> None:
        self.structured = structured
        self.sent = ""
        self._started = False
        self._calling = False
        self._pending = ""

    def _emit(self, text: str) -> str:
        if not self._started:
            self._started = True
            if self.sent:
                text = "\n\n" + text
        self.sent += text
        return text

    def delta(self, text: str) -> str:
        """The content to send for one text delta ('' for none)."""
        if self._calling:
            return ""
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
        body = self._pending + text
        kept = body.rstrip()
        self._pending = body[len(kept) :]
        return self._emit(kept) if kept else ""

    def tool_call(self) -> None:
        """The turn calls a tool: the rest of its text is not the answer."""
        self._calling = True

    def end_turn(self) -> None:
        """The model's turn is over (a ``thought`` event)."""
        self._started = self._calling = False
        self._pending = ""

    def note(self, text: str) -> str:
        """A note of the service's own (an approval waiting), as a turn of its own."""
        self.end_turn()
        sent = self._emit(text)
        self.end_turn()
        return sent

    def follow(self, event: RunEvent | None) -> str:
        """The content to send for one event of the run's ('' for none): its text deltas,
        its calls and turns (which end what a turn says), its final answer."""
        if self.structured:
            if isinstance(event, OutputEvent) and event.status == 200:
                return self.finish(event.output)
            return ""
        if isinstance(event, TextDeltaEvent):
            return self.delta(event.text)
        if isinstance(event, ToolCallStartedEvent):
            self.tool_call()
        elif isinstance(event, ThoughtEvent):
            self.end_turn()
        elif isinstance(event, OutputEvent):
            return self.finish(event.output)
        return ""

    def finish(self, output: str) -> str:
        """What is left to send of the final answer ``output``."""
        if self.sent.endswith(output):
            return ""
        if output.startswith(self.sent):
            rest = output[len(self.sent) :]
            self.sent = output
            return rest
        self.end_turn()
        return self._emit(output)


class AnswerPiece(NamedTuple):
    """Text to stream; with ``approval``, the notice of that pending approval."""

    text: str
    approval: dict[str, Any] | None = None


async def answer_pieces(
    backend: RunBackend,
    principal: Principal,
    run: RunView,
    keepalive: float,
    answer: AnswerText,
) -> AsyncGenerator[AnswerPiece | None, None]:
    """Follow a run the caller started listening, as the answer's text: a piece for each bit
    of text to send (``answer`` keeps what was sent), ``None`` where the stream should send a
    keepalive. Ends when the run's events end; closing it stops following the run."""
    following = await backend.events(run.request_id, principal, 0, keepalive, started=True)
    async with aclosing(following) as items:
        async for item in items:
            if item is None:
                yield None
                continue
            _, wire = item
            event = read_known(wire)
            if isinstance(event, ApprovalRequiredEvent):
                pending = {k: v for k, v in wire.items() if k != "kind"}
                yield AnswerPiece(answer.note(approval_notice(pending, streaming=True)), pending)
                continue
            text = answer.follow(event)
            if text:
                yield AnswerPiece(text)
