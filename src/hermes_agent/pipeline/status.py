"""Status codes: one vocabulary for stages, tool results and whole runs (HTTP-like on purpose,
so that anyone reading a trace knows what 404 or 408 means without a table)."""

from __future__ import annotations

from enum import IntEnum


class Status(IntEnum):
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
    TOOL_ERROR = 500
    """A tool raised, or a hook failed."""
    MODEL_ERROR = 502
    """The model failed, or kept producing output that could not be used."""
    RUN_TIMEOUT = 504
    """The whole run ran past its ``run_timeout_s`` (a tool past its own timeout is 408)."""


REFUSED: frozenset[Status] = frozenset(
    {Status.INVALID, Status.DENIED, Status.UNKNOWN_TOOL, Status.RATE_LIMITED}
)
"""Statuses of calls the pipeline turned down before running them: invalid, denied, unknown,
rate-limited. A call with one of these never ran."""
