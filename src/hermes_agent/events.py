"""The events a run emits, one class per kind — the one place they are listed.

``Agent.astream`` yields them, ``Agent.arun(listener=...)`` passes them to a callback, and the
service layers put them on the wire (``to_dict`` is their JSON shape). Every event has a
``kind`` (a string constant, the same on the wire) and typed attributes::

    async for event in agent.astream("What is 2 + 3?"):
        if isinstance(event, TextDeltaEvent):
            print(event.text, end="")
        elif isinstance(event, ResultEvent):
            print(event.result.output)

=====================  ====================  ===============================================
kind                   class                 when
=====================  ====================  ===============================================
``input``              InputEvent            the message was checked and laid out (stage 1)
``text_delta``         TextDeltaEvent        streamed answer text (``stream=True`` only)
``scratch_pad_delta``  ScratchPadDeltaEvent  streamed ``<scratch_pad>`` text
``thought_delta``      ThoughtDeltaEvent     streamed ``<think>`` text (or a server's reasoning)
``tool_call_started``  ToolCallStartedEvent  a ``<tool_call>`` opened in the stream
``tool_call_delta``    ToolCallDeltaEvent    streamed text of that call's JSON
``tool_call_parsed``   ToolCallParsedEvent   that call closed: parsed, or why it did not parse
``thought``            ThoughtEvent          the model's turn is in and parsed (stage 2)
``selection``          SelectionEvent        which calls may run, which were refused (stage 3)
``tool_results``       ToolResultsEvent      the calls of one step ran (stage 4)
``output``             OutputEvent           the answer is ready (stage 5)
``result``             ResultEvent           the run is over: the whole ``RunResult``
=====================  ====================  ===============================================

``event.data`` gives the attributes as a dict (nested values as dicts), as the events of earlier
versions carried them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from hermes_agent.types import RunResult, as_plain


@dataclass(slots=True)
class _EventBase:
    kind: ClassVar[str]

    @property
    def data(self) -> dict[str, Any]:
        """The attributes as a dict (nested dataclasses as dicts)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": ..., **attributes}``: the event's JSON shape on the wire."""
        return {"kind": self.kind, **self.data}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return as_plain(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


@dataclass(slots=True)
class InputEvent(_EventBase):
    kind: ClassVar[Literal["input"]] = "input"
    status: int
    request_id: str


@dataclass(slots=True)
class TextDeltaEvent(_EventBase):
    kind: ClassVar[Literal["text_delta"]] = "text_delta"
    text: str


@dataclass(slots=True)
class ScratchPadDeltaEvent(_EventBase):
    kind: ClassVar[Literal["scratch_pad_delta"]] = "scratch_pad_delta"
    text: str


@dataclass(slots=True)
class ThoughtDeltaEvent(_EventBase):
    kind: ClassVar[Literal["thought_delta"]] = "thought_delta"
    text: str
    revealed: bool = False
    """``True`` (at most once per step) when a bare ``</think>`` showed that everything
    streamed before it in this step was a thought the chat template had opened in the prompt:
    ``text`` is all of it, and the text and calls streamed before were not the answer."""


@dataclass(slots=True)
class ToolCallStartedEvent(_EventBase):
    kind: ClassVar[Literal["tool_call_started"]] = "tool_call_started"
    index: int
    """Position of the call in the model's turn."""


@dataclass(slots=True)
class ToolCallDeltaEvent(_EventBase):
    kind: ClassVar[Literal["tool_call_delta"]] = "tool_call_delta"
    index: int
    delta: str


@dataclass(slots=True)
class ToolCallParsedEvent(_EventBase):
    kind: ClassVar[Literal["tool_call_parsed"]] = "tool_call_parsed"
    index: int
    name: str | None
    """``None`` when the block did not parse (``error`` says why)."""
    arguments: dict[str, Any] | None
    error: str | None = None


@dataclass(slots=True)
class ThoughtEvent(_EventBase):
    kind: ClassVar[Literal["thought"]] = "thought"
    status: int
    step: int
    content: str = ""
    tool_calls: list[str] = field(default_factory=list)
    """Names of the tools the model called, in order."""
    parse_errors: list[str] = field(default_factory=list)
    error: str | None = None
    """Set when the model call itself failed (status 502)."""
    thought: str | None = None
    """A thinking model's thought for this turn (never a source of calls)."""
    notes: list[str] = field(default_factory=list)
    """What the parser saw and did not act on, such as a call written inside the thought."""
    tokens: int = 0
    """The tokens this model turn used (prompt and completion): what a quota counts per turn,
    however the run ends afterwards."""


@dataclass(slots=True)
class PlannedCallView:
    """A call the ToolSelector let through."""

    name: str
    arguments: dict[str, Any]


@dataclass(slots=True)
class RefusedCallView:
    """A call the ToolSelector refused, with the status and the message the model reads."""

    name: str
    status: int
    error: str | None


@dataclass(slots=True)
class SelectionEvent(_EventBase):
    kind: ClassVar[Literal["selection"]] = "selection"
    status: int
    planned: list[PlannedCallView] = field(default_factory=list)
    rejected: list[RefusedCallView] = field(default_factory=list)


@dataclass(slots=True)
class ToolOutcomeView:
    """What one call returned (``content`` as the model reads it)."""

    name: str
    status: int
    content: Any


@dataclass(slots=True)
class ToolResultsEvent(_EventBase):
    kind: ClassVar[Literal["tool_results"]] = "tool_results"
    status: int
    results: list[ToolOutcomeView] = field(default_factory=list)


@dataclass(slots=True)
class OutputEvent(_EventBase):
    kind: ClassVar[Literal["output"]] = "output"
    status: int
    output: str
    error: str | None = None


@dataclass(slots=True)
class ResultEvent(_EventBase):
    kind: ClassVar[Literal["result"]] = "result"
    result: RunResult

    @property
    def data(self) -> dict[str, Any]:
        return {"result": self.result}  # the RunResult itself; ``to_dict`` serialises it

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "result": self.result.to_dict()}


Event = (
    InputEvent
    | TextDeltaEvent
    | ScratchPadDeltaEvent
    | ThoughtDeltaEvent
    | ToolCallStartedEvent
    | ToolCallDeltaEvent
    | ToolCallParsedEvent
    | ThoughtEvent
    | SelectionEvent
    | ToolResultsEvent
    | OutputEvent
    | ResultEvent
)
"""Any event a run emits."""

EVENT_TYPES: tuple[type[_EventBase], ...] = (
    InputEvent,
    TextDeltaEvent,
    ScratchPadDeltaEvent,
    ThoughtDeltaEvent,
    ToolCallStartedEvent,
    ToolCallDeltaEvent,
    ToolCallParsedEvent,
    ThoughtEvent,
    SelectionEvent,
    ToolResultsEvent,
    OutputEvent,
    ResultEvent,
)
EVENT_KINDS: tuple[str, ...] = tuple(cls.kind for cls in EVENT_TYPES)
