"""The events the run layer adds to a run's own (``hermes_agent.events``), in both engines:
approvals asked and answered, and how a run ended when it ended without a result. Nothing
outside these classes builds their wire dicts."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal


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


ServiceEvent = ApprovalRequiredEvent | ApprovalResolvedEvent | RunStoppedEvent


def result_wire(result: dict[str, Any]) -> dict[str, Any]:
    """The ``result`` event of a run whose ``RunResult`` is known only as its JSON (read back
    from the queue's store): the wire shape ``hermes_agent.events.ResultEvent`` gives."""
    return {"kind": "result", "result": result}
