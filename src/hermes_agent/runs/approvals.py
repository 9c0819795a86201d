"""Approvals over the API: a pending approval, bound to one run, one user, one tool and the
exact arguments that were shown; answered once, or denied when it expires."""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hermes_agent.runs.backend import ApprovalConflict
from hermes_agent.runs.events import ApprovalRequiredEvent

EXPIRED = "expired"


class ApprovalAnswered(ApprovalConflict):
    """The approval has an answer already (an approval is single-use)."""


@dataclass(slots=True)
class PendingApproval:
    """One tool call waiting for its owner's answer."""

    id: str
    request_id: str
    user_id: str
    tool: str
    arguments: dict[str, Any]
    created: float
    expires: float
    decision: asyncio.Future[tuple[bool, str]] = field(repr=False)

    @property
    def answered(self) -> bool:
        return self.decision.done()

    def event(self) -> ApprovalRequiredEvent:
        """The ``approval_required`` event that shows it to the client."""
        return ApprovalRequiredEvent(
            approval_id=self.id,
            request_id=self.request_id,
            tool=self.tool,
            arguments=copy.deepcopy(self.arguments),
            created=_iso(self.created),
            expires=_iso(self.expires),
        )

    def to_dict(self) -> dict[str, Any]:
        """As listed in a 202 or a run's status (without ``kind``)."""
        data = self.event().to_dict()
        del data["kind"]
        return data


class ApprovalBook:
    """The approvals of this process: pending ones, and answered ones kept a while so that a
    second answer gets 409 rather than 404. Bounded: the oldest answered ones are forgotten."""

    def __init__(self, max_answered: int = 10_000) -> None:
        self._items: OrderedDict[str, PendingApproval] = OrderedDict()
        self._max_answered = max_answered

    def open(
        self, request_id: str, user_id: str, tool: str, arguments: dict[str, Any], ttl: float
    ) -> PendingApproval:
        """A new pending approval for exactly ``tool`` and ``arguments``."""
        now = time.time()
        pending = PendingApproval(
            id=uuid.uuid4().hex,
            request_id=request_id,
            user_id=user_id,
            tool=tool,
            # A copy: what the owner approves is what was shown, whatever happens to the original.
            arguments=copy.deepcopy(arguments),
            created=now,
            expires=now + ttl,
            decision=asyncio.get_running_loop().create_future(),
        )
        self._items[pending.id] = pending
        self._trim()
        return pending

    def get(self, approval_id: str, user_id: str, *, admin: bool = False) -> PendingApproval | None:
        """The approval, if it exists and belongs to ``user_id`` (or the caller is an admin)."""
        pending = self._items.get(approval_id)
        if pending is None or (pending.user_id != user_id and not admin):
            return None
        return pending

    def answer(self, pending: PendingApproval, approved: bool, reason: str) -> None:
        """Resolve it once; ``ApprovalAnswered`` if it has an answer already."""
        if pending.answered:
            raise ApprovalAnswered(pending.id)
        pending.decision.set_result((approved, reason))

    def pending_for(self, request_id: str) -> list[PendingApproval]:
        """The unanswered approvals of one run, oldest first."""
        return [p for p in self._items.values() if p.request_id == request_id and not p.answered]

    def forget_run(self, request_id: str) -> None:
        """Drop a run's approvals (the run was evicted from memory)."""
        for key in [k for k, p in self._items.items() if p.request_id == request_id]:
            del self._items[key]

    def _trim(self) -> None:
        answered = [k for k, p in self._items.items() if p.answered]
        for key in answered[: max(0, len(answered) - self._max_answered)]:
            del self._items[key]


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()
