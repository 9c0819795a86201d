"""What an OpenAI-compatible reply becomes as Hermes text: native calls and reasoning rendered
as the ``<tool_call>`` and ``<think>`` blocks the rest of the runtime reads, whole or piece by
piece as a stream arrives."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hermes_agent.models import openai_reply as json_reply
from hermes_agent.models.openai_reply import JSON
from hermes_agent.protocol.chatml import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    render_tool_call,
    to_json,
    wrap_tool_call,
)
from hermes_agent.protocol.decoding import NonFiniteNumber, loads_finite
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.types import Completion, ParseError, ToolCall, new_call_id


def merge_native(
    content: str, native: Sequence[JSON], reasoning: str = ""
) -> tuple[Completion, str]:
    """The server's reasoning as a thought first, then calls a local model leaked into
    ``content`` (they were written first), then the native ``tool_calls``; the text shows them
    as a ``<think>`` block and ``<tool_call>`` blocks."""
    if reasoning.strip():
        content = _THINK_OPEN + _defused(reasoning) + _THINK_CLOSE + content
    completion = parse_completion(content)
    parts = [content] if content else []
    for native_call in native:
        function = json_reply.part(native_call, "function")
        if function is None:  # a non-function (custom) tool call: nothing we can run
            continue
        name = json_reply.name(function)
        raw = json_reply.arguments_text(function)
        arguments, problem = _decode_arguments(name, raw)
        if arguments is None:
            block = _call_head(name) + raw + "}"
            completion.errors.append(ParseError(block=block, message=problem))
            parts.append(wrap_tool_call(block))
        else:
            call_id = json_reply.text(native_call, "id") or new_call_id()
            call = ToolCall(name=name, arguments=arguments, id=call_id)
            completion.tool_calls.append(call)
            parts.append(render_tool_call(call))
    return completion, "\n".join(parts)


def _decode_arguments(name: str, raw: str) -> tuple[dict[str, Any] | None, str]:
    """Arguments JSON → dict, or ``None`` and a message the model can act on."""
    if not raw.strip():
        return {}, ""
    try:
        value = loads_finite(raw)  # no NaN or Infinity: no call carries them
        if isinstance(value, str):  # double-encoded by some servers
            value = loads_finite(value)
    except json.JSONDecodeError as exc:
        return None, f"The arguments of the call to {name!r} are not valid JSON ({exc.msg})."
    except NonFiniteNumber as exc:
        return None, f"The arguments of the call to {name!r} are not valid JSON ({exc})."
    if not isinstance(value, dict):
        kind = type(value).__name__
        return None, f"The arguments of the call to {name!r} must be a JSON object, not {kind}."
    return value, ""


def _call_head(name: str, call_id: str | None = None) -> str:
    # The server's call id travels inside the JSON so the parsed call keeps it (native servers
    # expect tool results to quote the id they issued).
    head = '{"id": ' + to_json(call_id) + ", " if call_id else "{"
    return head + '"name": ' + to_json(name) + ', "arguments": '


_THINK_OPEN = "<think>\n"
_THINK_CLOSE = "\n</think>\n"
_END_OF_THOUGHT = "</think>"
# What a literal </think> inside a server's reasoning becomes: still readable, no longer a tag.
_DEFUSED_END = "</think >"


def _defused(reasoning: str) -> str:
    return reasoning.replace(_END_OF_THOUGHT, _DEFUSED_END)


class StreamedThought:
    """Renders streamed reasoning deltas as one ``<think>`` block, piece by piece.

    It opens with the first delta and closes when text or a call follows or the stream ends.
    A ``</think>`` split across deltas is held back until it can be defused whole.
    """

    def __init__(self) -> None:
        self._open = False
        self._held = ""

    def feed(self, reasoning: str) -> str:
        head = "" if self._open else _THINK_OPEN
        self._open = True
        text = _defused(self._held + reasoning)
        keep = next(
            (k for k in range(len(_END_OF_THOUGHT) - 1, 0, -1)
             if text.endswith(_END_OF_THOUGHT[:k])),
            0,
        )  # fmt: skip
        self._held = text[len(text) - keep :]
        return head + text[: len(text) - keep]

    def finish(self) -> str:
        """Close the thought, if one is open; return the closing text."""
        if not self._open:
            return ""
        self._open = False
        held, self._held = self._held, ""
        return held + _THINK_CLOSE


class StreamedCalls:
    """Renders streamed native tool-call deltas as Hermes ``<tool_call>`` text, piece by piece.

    A call opens when its index first appears with a name, its argument deltas pass through as
    they arrive, and it closes when the next index opens or the stream ends.
    """

    def __init__(self) -> None:
        self._index: int | str | None = None
        self._name: str | None = None
        self._id: str | None = None
        self._pending = ""  # argument text that arrived before the name
        self._has_arguments = False
        self._open = False
        self._written = False  # anything yielded yet (calls after it need a newline)

    def wrote(self, text: str) -> None:
        self._written = self._written or bool(text)

    def feed(self, delta: JSON) -> str:
        out = ""
        index = json_reply.call_index(delta)
        if index != self._index:
            out += self.finish()
            self._index, self._name, self._pending = index, None, ""
            self._id = None
        if json_reply.text(delta, "id"):
            self._id = json_reply.text(delta, "id")
        function = json_reply.part(delta, "function")
        name = json_reply.name(function)
        if name and self._name is None:
            self._name = name
        arguments = json_reply.arguments_text(function)
        if self._name is None:
            self._pending += arguments
            return out
        if not self._open:
            self._open, self._has_arguments = True, False
            out += (
                ("\n" if self._written else "") + TOOL_CALL_OPEN + _call_head(self._name, self._id)
            )
            arguments = self._pending + arguments
            self._pending = ""
        if arguments.strip():
            self._has_arguments = True
        out += arguments
        self.wrote(out)
        return out

    def finish(self) -> str:
        """Close the open call, if any; return the closing text."""
        if not self._open:
            return ""
        self._open, self._index, self._name = False, None, None
        return ("" if self._has_arguments else "{}") + "}" + TOOL_CALL_CLOSE
