"""The events the run layer adds to a run's own (``hermes_agent.events``), in both engines:
approvals asked and answered, and how a run ended when it ended without a result. Nothing
outside these classes builds their wire dicts.

A run's log holds events as their wire dicts (that is what streams, and what the queue's
store keeps); whoever acts on one reads it back as its type first, and dispatches on the
type::

    event = read_event(wire)
    if isinstance(event, ThoughtEvent):
        turns += event.tokens
    elif isinstance(event, StoredResultEvent):
        answer = event.result["output"]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

from hermes_agent.errors import HermesAgentError
from hermes_agent.events import (
    EVENT_TYPES,
    Event,
    PlannedCallView,
    RefusedCallView,
    ResultEvent,
    SelectionEvent,
    ToolOutcomeView,
    ToolResultsEvent,
)


@dataclass(slots=True)
class ApprovalRequiredEvent:
    """A tool call waits for ``POST /v1/approvals/{approval_id}`` (or a WebSocket
    ``approve``); unanswered by ``expires`` it is denied as ``expired``."""

    kind: ClassVar[Literal["approval_required"]] = "approval_required"
    approval_id: str
    request_id: str
    tool: str
    arguments: dict[str, Any]
    created: str
    """ISO 8601, UTC."""
    expires: str | None
    """``None`` for a queued run's approval: it waits until answered or its run cancelled."""

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "approval_required", ...}``: the wire shape."""
        return {"kind": self.kind, **asdict(self)}


@dataclass(slots=True)
class ApprovalResolvedEvent:
    """The answer to an approval: by its owner, or ``expired``, or denied at once because
    nobody was listening."""

    kind: ClassVar[Literal["approval_resolved"]] = "approval_resolved"
    approval_id: str
    approved: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The wire shape."""
        return {"kind": self.kind, **asdict(self)}


@dataclass(slots=True)
class RunStoppedEvent:
    """The last event of a run that ended without a ``result``: ``cancelled``, ``timed_out``,
    ``failed``, ``dead`` or ``interrupted`` (``error`` says why)."""

    kind: ClassVar[Literal["run_stopped"]] = "run_stopped"
    status: str
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        """The wire shape."""
        return {"kind": self.kind, **asdict(self)}


@dataclass(slots=True)
class StoredResultEvent:
    """The ``result`` event as the run layer reads it back: the run's ``RunResult`` as its
    JSON (``RunResult.to_dict``), which is all the queue's store keeps of it. The wire shape
    is ``hermes_agent.events.ResultEvent``'s."""

    kind: ClassVar[Literal["result"]] = "result"
    result: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The wire shape."""
        return {"kind": self.kind, "result": self.result}

    @property
    def tokens(self) -> int | None:
        """The run's total tokens, when its result says."""
        usage = self.result.get("usage")
        if not isinstance(usage, Mapping):
            return None
        total = usage.get("total_tokens")
        if total is None:
            total = int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
        return int(total)


ServiceEvent = ApprovalRequiredEvent | ApprovalResolvedEvent | RunStoppedEvent

RunEvent = Event | StoredResultEvent | ServiceEvent
"""Any event of a run's log as ``read_event`` gives it back (a ``result`` as
``StoredResultEvent``)."""

END_EVENTS = (StoredResultEvent, RunStoppedEvent)
"""The types of a run's last event."""


class UnknownEvent(HermesAgentError, ValueError):
    """A wire dict that is not an event of this version (its ``kind`` is unknown, or its
    fields do not fit it)."""


_BY_KIND: dict[str, type[Any]] = {
    **{cls.kind: cls for cls in EVENT_TYPES if cls is not ResultEvent},
    **{cls.kind: cls for cls in (ApprovalRequiredEvent, ApprovalResolvedEvent, RunStoppedEvent)},
}
_NESTED: dict[tuple[type[Any], str], type[Any]] = {
    (SelectionEvent, "planned"): PlannedCallView,
    (SelectionEvent, "rejected"): RefusedCallView,
    (ToolResultsEvent, "results"): ToolOutcomeView,
}
_FIELDS: dict[type[Any], frozenset[str]] = {
    cls: frozenset(f.name for f in dataclasses.fields(cls))
    for cls in (*_BY_KIND.values(), *_NESTED.values())
}


def _build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    names = _FIELDS[cls]
    kept = {name: value for name, value in values.items() if name in names}
    try:
        return cls(**kept)
    except TypeError as exc:  # a field it needs is missing
        raise UnknownEvent(f"not a {cls.__name__}: {exc}") from None


def read_event(wire: Mapping[str, Any]) -> RunEvent:
    """The event a wire dict is (``UnknownEvent`` when it is none of this version's). Fields
    the type does not have are ignored, so logs written by a newer version still read."""
    kind = wire.get("kind")
    if kind == "result":
        result = wire.get("result")
        if not isinstance(result, Mapping):
            raise UnknownEvent("a result event without its result")
        return StoredResultEvent(dict(result))
    cls = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise UnknownEvent(f"unknown event kind {kind!r}")
    values = dict(wire)
    for (owner, name), view in _NESTED.items():
        if owner is cls and isinstance(values.get(name), list):
            values[name] = [
                _build(view, item) for item in values[name] if isinstance(item, Mapping)
            ]
    event: RunEvent = _build(cls, values)
    return event


def read_known(wire: Mapping[str, Any]) -> RunEvent | None:
    """``read_event``, with ``None`` for what this version does not know (a log may hold
    events of a newer one: they pass through unread)."""
    try:
        return read_event(wire)
    except UnknownEvent:
        return None


def is_end(wire: Mapping[str, Any]) -> bool:
    """Whether a wire dict is a run's last event (its result, or how it stopped)."""
    return isinstance(read_known(wire), END_EVENTS)


def result_wire(result: dict[str, Any]) -> dict[str, Any]:
    """The ``result`` event of a run whose ``RunResult`` is known only as its JSON (read back
    from the queue's store): the wire shape ``hermes_agent.events.ResultEvent`` gives."""
    return StoredResultEvent(result).to_dict()
