"""The JSON body ``OpenAICompatible`` sends to ``/chat/completions``, built from plain dicts.

The SDK's ``chat.completions.create`` passes its arguments through a per-request transform that
walks every message of the conversation (milliseconds for a long one, so a run's client cost
grew with the square of its length). Our messages are plain dicts already, so the model builds
the body here and hands it to the SDK's lower-level ``post``, which keeps the SDK's auth
headers, retries, timeouts, error classes and response models. The body is the JSON
``create()`` would send for the same arguments (``tests/models/test_openai_request.py``
compares the two).

Per step, only the turns added since the last request are rendered: ``WireCache`` keeps the
wire form of each message it rendered, keyed by the message object and checked against a
shallow snapshot of the fields that shape it, so a message that was replaced, or changed in
place at the top level (content, calls, results, a result's ``data``), is rendered again.
Changes deeper than that inside an already-sent argument or result (a nested list appended to
in place) are not seen; the pipeline never makes them. The tools prompt of ``hermes`` mode and
the grammar are cached by the identity of the tool dicts (the registry builds a new dict
whenever a tool changes).

Wire forms:

- ``native``: OpenAI chat messages; a ``tool`` turn becomes one message per result, each with
  its ``tool_call_id``; an assistant turn keeps ``""`` beside its ``tool_calls`` (llama-cpp-
  python's and sglang's servers reject ``null``).
- ``hermes`` / ``qwen``: the Hermes text protocol (``protocol.chatml``): one system turn with the
  tools prompt and every system message, assistant turns as ``<tool_call>`` text, results as
  ``<tool_response>`` blocks in a ``tool`` turn (``hermes``, with the id of the first call it
  answers, which the chat API requires) or a ``user`` turn (``qwen``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from hermes_agent.protocol.chatml import render_system, render_turn, to_json
from hermes_agent.protocol.prompts import hermes_tools_prompt, qwen_tools_prompt
from hermes_agent.types import Message

WireMessage = dict[str, Any]
WireKind = str  # "native", "hermes" or "qwen"

# Per generation (see _Generations): at most this many wire forms, and this many characters
# of message text in them, so that finished conversations with large results are let go.
_MESSAGES_KEPT = 4096
_CHARACTERS_KEPT = 8 * 2**20
_PROMPTS_KEPT = 64


def native_messages(message: Message) -> list[WireMessage]:
    """One protocol-neutral message as OpenAI chat messages (a tool turn becomes one per result)."""
    if message.role == "tool":
        return [
            {"role": "tool", "tool_call_id": result.call_id, "content": to_json(result.content)}
            for result in message.tool_results
        ]
    if message.role != "assistant":
        return [{"role": message.role, "content": message.content}]
    content = message.content
    if message.scratch_pad:
        # No native field for it; keep the plan visible to the model the way it wrote it.
        content = f"<scratch_pad>\n{message.scratch_pad}\n</scratch_pad>\n{content}".rstrip()
    wire: WireMessage = {"role": "assistant", "content": content}
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": to_json(call.arguments)},
            }
            for call in message.tool_calls
        ]
    return [wire]


def hermes_message(message: Message, chat_format: str) -> list[WireMessage]:
    """One non-system message in the Hermes text protocol (``chat_format`` hermes or qwen),
    rendered (and escaped) by ``protocol.chatml.render_turn``."""
    wire: WireMessage = dict(render_turn(message, chat_format))
    if wire["role"] == "tool":
        answered = message.tool_results
        wire["tool_call_id"] = answered[0].call_id if answered else ""
    return [wire]


def native_tool_choice(tool_choice: str) -> str | dict[str, Any]:
    """``tool_choice`` as the chat API spells it (a tool name becomes a function selector)."""
    if tool_choice in ("auto", "required", "none"):
        return tool_choice
    return {"type": "function", "function": {"name": tool_choice}}


class WireCache:
    """Wire forms of messages and tool prompts already rendered, reused while unchanged.

    One per model; safe to share between the runs (and event loops) the model serves, since an
    entry is used only for the very message object it was made from, still as it was then.
    """

    def __init__(self) -> None:
        self._messages: dict[WireKind, _Generations] = {}
        self._prompts: dict[tuple[Any, ...], tuple[Sequence[dict[str, Any]], Any]] = {}

    def native(self, messages: Sequence[Message]) -> list[WireMessage]:
        """The conversation as OpenAI chat messages."""
        cache = self._generations("native")
        wire: list[WireMessage] = []
        for message in messages:
            wire.extend(cache.render(message, native_messages))
        return wire

    def hermes(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        *,
        chat_format: str,
        scratch_pad: bool,
        tool_choice: str,
        preamble: str | None = None,
    ) -> list[WireMessage]:
        """The conversation in the Hermes text protocol: the same messages as
        ``protocol.chatml.render_conversation``, plus the ``tool_call_id`` of each tool turn."""
        cache = self._generations(chat_format)

        def render(message: Message) -> list[WireMessage]:
            return hermes_message(message, chat_format)

        system: list[str] = []
        offer = bool(tools) and tool_choice != "none"
        if offer and chat_format == "hermes":
            system.append(
                self.for_tools(
                    ("hermes", scratch_pad, tool_choice, preamble),
                    tools,
                    lambda: hermes_tools_prompt(
                        tools, scratch_pad=scratch_pad, tool_choice=tool_choice, preamble=preamble
                    ),
                )
            )
        turns: list[WireMessage] = []
        for message in messages:
            if message.role == "system":
                if message.content:
                    system.append(message.content)
            else:
                turns.extend(cache.render(message, render))
        if offer and chat_format == "qwen":
            system.append(
                self.for_tools(
                    ("qwen", tool_choice),
                    tools,
                    lambda: qwen_tools_prompt(tools, tool_choice=tool_choice),
                )
            )
        if system:
            turns.insert(0, dict(render_system(system)))
        return turns

    def for_tools(
        self, key: tuple[Any, ...], tools: Sequence[dict[str, Any]], make: Callable[[], Any]
    ) -> Any:
        """``make()``, computed once for these very tool dicts and ``key``."""
        full = (*key, *map(id, tools))
        kept = self._prompts.get(full)
        if kept is not None:  # the tools are kept too, so their ids cannot be reused meanwhile
            return kept[1]
        value = make()
        if len(self._prompts) >= _PROMPTS_KEPT:
            self._prompts.clear()
        self._prompts[full] = (tuple(tools), value)
        return value

    def _generations(self, kind: WireKind) -> _Generations:
        cache = self._messages.get(kind)
        if cache is None:
            cache = self._messages[kind] = _Generations(_MESSAGES_KEPT, _CHARACTERS_KEPT)
        return cache


# The fields of a message its wire form is made of (besides its calls and results).
_HEAD = operator.attrgetter("role", "content", "scratch_pad", "raw")


class _Entry:
    """A message's wire form and a snapshot of what it was made of: the message's own fields,
    and each call and result with its fields and its arguments or content copied one level
    deep, so that a field rebound or a container changed in place since no longer matches."""

    __slots__ = ("head", "message", "parts", "size", "wire")

    def __init__(self, message: Message, wire: list[WireMessage]) -> None:
        self.message = message
        self.size = sum(_characters(item) for item in wire)
        self.head = _HEAD(message)
        self.parts: tuple[int, int, list[tuple[Any, ...]]] | None = None
        if message.tool_calls or message.tool_results:
            parts: list[tuple[Any, ...]] = [
                (c, c.name, c.id, _shallow(c.arguments)) for c in message.tool_calls
            ]
            parts += [(r, r.name, r.call_id, _shallow(r.content)) for r in message.tool_results]
            self.parts = (len(message.tool_calls), len(message.tool_results), parts)
        self.wire = wire

    def matches(self, message: Message) -> bool:
        """``message`` is the one this entry was made from, unchanged since."""
        if message is not self.message or _HEAD(message) != self.head:
            return False
        calls, results = message.tool_calls, message.tool_results
        if self.parts is None:
            return not calls and not results
        count_calls, count_results, parts = self.parts
        if len(calls) != count_calls or len(results) != count_results:
            return False
        now: list[tuple[Any, ...]] = [(c, c.name, c.id, c.arguments) for c in calls]
        now += [(r, r.name, r.call_id, r.content) for r in results]
        for (item, name, ident, value), (kept, kept_name, kept_ident, kept_value) in zip(
            now, parts, strict=True
        ):
            if item is not kept or name != kept_name or ident != kept_ident:
                return False
            if value is not kept_value and not _same_container(value, kept_value):
                return False
        return True


class _Generations:
    """A two-generation cache keyed by message identity: when the current generation is full
    (in entries or in characters) it becomes the previous one, and an entry found there moves
    back to the current one. The messages of runs still going are looked up at every step, so
    they stay; those of finished runs age out. Cheaper per hit than an LRU list, and as
    bounded."""

    def __init__(self, capacity: int, characters: int) -> None:
        self._capacity = capacity
        self._characters = characters
        self._size = 0  # characters in the current generation
        self._current: dict[int, _Entry] = {}
        self._previous: dict[int, _Entry] = {}

    def render(
        self, message: Message, render: Callable[[Message], list[WireMessage]]
    ) -> list[WireMessage]:
        key = id(message)
        entry = self._current.get(key)
        if entry is None:
            entry = self._previous.pop(key, None)
            if entry is not None:
                self._keep(key, entry)
        if entry is not None and entry.matches(message):
            return entry.wire
        entry = _Entry(message, render(message))
        self._keep(key, entry)
        return entry.wire

    def _keep(self, key: int, entry: _Entry) -> None:
        if len(self._current) >= self._capacity or self._size >= self._characters:
            self._previous, self._current, self._size = self._current, {}, 0
        self._current[key] = entry
        self._size += entry.size


def _characters(wire: WireMessage) -> int:
    """About how much text a wire message holds (its content and call arguments)."""
    size = len(wire["content"]) if isinstance(wire.get("content"), str) else 0
    for call in wire.get("tool_calls", ()):
        size += len(call["function"]["arguments"])
    return size


def _shallow(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


def _same_container(current: Any, kept: Any) -> bool:
    """``current`` is a dict or list still equal to ``kept``, its copy of one level. Items are
    compared by identity first, so an unchanged one costs a pass over its top level, not a deep
    comparison. Anything else must have been the very same object (an ``__eq__`` may be costly,
    or not return a bool)."""
    if type(current) is not type(kept) or not isinstance(kept, (dict, list)):
        return False
    try:
        return bool(current == kept)
    except Exception:  # an item whose comparison fails: count it as changed
        return False
