"""Status codes: one vocabulary for stages, tool results and whole runs (HTTP-like on purpose,
so that anyone reading a trace knows what 404 or 408 means without a table).

This is the first of the four "status" notions a run carries; each answers another question:

=================================  ==========================  ==================================
what                               where                       answers
=================================  ==========================  ==================================
``Status`` (an int: 200, 500...)   ``RunResult.status``,       how a stage, a tool call or the
                                   ``Step.status_code``,       whole run came out
                                   ``ToolResult.status_code``,
                                   the trail's records
``LoopStatus`` (a string)          ``RunResult.loop_status``   how the loop ended (``completed``,
                                   (``hermes_agent.types``)    ``max_iterations``, ``failed``...)
``RunStatus`` (a string)           a service or queued run's   where the run is in its life
                                   ``status``, the queue's     (``queued``, ``running``,
                                   rows (``runs.status``)      ``completed``, ``failed``...)
the HTTP status                    the answer to               the run's ending, for a client
                                   ``POST /v1/runs``           that does not read the body
=================================  ==========================  ==================================

They are derived in that order: the loop sets ``Status`` and ``LoopStatus`` together,
``runs.status.ending_status`` turns a result into its ``RunStatus``, and a plain
``POST /v1/runs`` answers 200 for a ``completed`` run, else its result's ``Status``, or, for a
run that ended without a result, its ``runs.status.STOP_CODES`` code
(``server.routes_runs.finished_status``). The same words mean different things across them:
``RunResult.status`` is a code, a run's ``status`` a lifecycle word; a ``completed`` run may
carry a 206 and a ``loop_status`` of ``max_iterations``.
"""

from __future__ import annotations

import warnings
from enum import EnumType, IntEnum
from typing import TYPE_CHECKING, Any

__all__ = ["REFUSED", "Status"]

_RENAMED = {"TOOL_ERROR": "INTERNAL_ERROR"}
"""Old member names, read (with a ``DeprecationWarning``) for one more release."""


class _StatusType(EnumType):
    """Resolves the old member names in ``_RENAMED`` to the new ones, with a warning (hidden
    from type checkers, so that a misspelt member is still an error to them)."""

    if not TYPE_CHECKING:

        def __getattr__(cls, name: str) -> Any:
            if name in _RENAMED:
                return super().__getitem__(_renamed(name))
            if name.startswith("_"):
                raise AttributeError(name)
            try:  # how Python 3.11 finds a member
                return cls.__dict__["_member_map_"][name]
            except KeyError:
                raise AttributeError(name) from None

        def __getitem__(cls, name: str) -> Any:
            return super().__getitem__(_renamed(name) if name in _RENAMED else name)


def _renamed(name: str) -> str:
    new = _RENAMED[name]
    warnings.warn(
        f"Status.{name} is deprecated: use Status.{new} (the same 500)",
        DeprecationWarning,
        stacklevel=3,  # the caller of Status.X or Status["X"]
    )
    return new


class Status(IntEnum, metaclass=_StatusType):
    OK = 200
    """The stage (or run) did what was asked."""
    PARTIAL = 206
    """Something came back, but not everything: max_iterations reached, a run budget
    (``max_run_tokens``, ``max_run_cost``) spent, some calls failed."""
    INVALID = 400
    """Invalid input: malformed tool call, arguments that fail the schema, empty message."""
    DENIED = 403
    """A call was refused (approval denied, vetoed by a hook)."""
    UNKNOWN_TOOL = 404
    """The model called a tool that does not exist, or is not visible or available."""
    TIMEOUT = 408
    """A tool ran past its timeout."""
    UNPROCESSABLE = 422
    """The model's answer never matched the run's ``output_type`` (structured output)."""
    RATE_LIMITED = 429
    """A tool's call rate limit was hit."""
    INTERNAL_ERROR = 500
    """Something on the agent's own side failed: a tool raised (or its process died), a hook
    failed, a stage or a renderer broke — neither the caller's input (4xx) nor the model (502).
    Was ``TOOL_ERROR``, still read with a ``DeprecationWarning``; traces keep the
    ``error.type`` ``tool_error`` for it (``tracing.error_type``)."""
    if TYPE_CHECKING:
        TOOL_ERROR = 500
        """Deprecated: ``INTERNAL_ERROR`` (at run time the metaclass resolves it)."""
    MODEL_ERROR = 502
    """The model failed, or kept producing output that could not be used."""
    RUN_TIMEOUT = 504
    """The whole run ran past its ``run_timeout_s`` (a tool past its own timeout is 408)."""


REFUSED: frozenset[Status] = frozenset(
    {Status.INVALID, Status.DENIED, Status.UNKNOWN_TOOL, Status.RATE_LIMITED}
)
"""Statuses of calls the pipeline turned down before running them: invalid, denied, unknown,
rate-limited. A call with one of these never ran."""
