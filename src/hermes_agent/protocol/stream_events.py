"""The events ``StreamParser`` emits as it reads a completion chunk by chunk (``protocol.parser``
says what each part of a completion is). Import them from ``hermes_agent.protocol``."""

from __future__ import annotations

from dataclasses import dataclass

from hermes_agent.types import ParseError, ToolCall

__all__ = [
    "ScratchPadDelta",
    "StreamEvent",
    "TextDelta",
    "ThoughtDelta",
    "ThoughtRevealed",
    "ToolCallArgumentsDelta",
    "ToolCallFinished",
    "ToolCallStarted",
]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """More ``content`` text. Never holds part of a tag; ``content`` is all of them, stripped."""

    text: str


@dataclass(frozen=True, slots=True)
class ScratchPadDelta:
    """More text inside a ``<scratch_pad>`` (unstripped)."""

    text: str


@dataclass(frozen=True, slots=True)
class ThoughtDelta:
    """More text inside a ``<think>`` thought (unstripped). Never holds the thought's tags."""

    text: str


@dataclass(frozen=True, slots=True)
class ThoughtRevealed:
    """A bare ``</think>`` (no ``<think>`` before it) showed that everything before it was a
    thought: the chat template opened ``<think>`` in the prompt. ``text`` is that thought, raw;
    every ``TextDelta``, ``ScratchPadDelta`` and tool-call event before this one was part of
    it and is void (its calls are ``thought_calls`` now). Comes at most once per stream. A
    caller that knows its template opens ``<think>`` passes ``in_thought=True`` and never
    sees this.
    """

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A ``<tool_call>`` (or ``<tools>``) tag opened block number ``index`` (0, 1, ... in order
    of appearance)."""

    index: int


@dataclass(frozen=True, slots=True)
class ToolCallArgumentsDelta:
    """Raw text inside block ``index`` as it arrives (JSON, possibly incomplete)."""

    index: int
    delta: str


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    """Block ``index`` ended and was parsed: exactly one of ``call`` and ``error`` is set.

    A block that holds a list of calls finishes with one event per call, all with its index.
    """

    index: int
    call: ToolCall | None = None
    error: ParseError | None = None


StreamEvent = (
    TextDelta
    | ScratchPadDelta
    | ThoughtDelta
    | ThoughtRevealed
    | ToolCallStarted
    | ToolCallArgumentsDelta
    | ToolCallFinished
)
"""What ``StreamParser.feed`` and ``flush`` return, in stream order."""
