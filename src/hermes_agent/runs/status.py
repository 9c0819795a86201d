"""The one vocabulary of a run's status, in process and on the queue: where a run is in its
life (``RunStatus``), as ``GET /v1/runs/{id}`` shows it and the queue's rows store it. It is not
the result's status code (``RunResult.status``, a ``pipeline.status.Status``: how the run came
out) nor its ``loop_status`` (how the loop ended); ``pipeline.status`` draws the four status
notions a run carries side by side, and ``ending_status`` below is where a result becomes one of
these.

=====================  =======================================================================
status                 meaning
=====================  =======================================================================
``queued``             admitted, waiting for a worker (queue only)
``running``            a model turn or a tool call is under way
``waiting_approval``   a tool call waits for its owner's answer (on the queue it holds no worker)
``completed``          the run answered (its result says with which status code: 200, 206)
``failed``             the run itself failed: the model, a stage, a hook, refused input or an
                       answer that never matched its schema (``error`` says why; a run that got
                       as far as a result keeps it: status 400, 422, 500 or 502)
``cancelled``          its owner, an operator or a shutdown cancelled it
``timed_out``          it ran past ``run_timeout_s``
``dead``               its deliveries were used up without an ending (queue only)
``interrupted``        the process that ran it died; nobody will finish it
=====================  =======================================================================
"""

from __future__ import annotations

from typing import Literal

from hermes_agent.types import RunResult

RunStatus = Literal[
    "queued",
    "running",
    "waiting_approval",
    "completed",
    "failed",
    "cancelled",
    "timed_out",
    "dead",
    "interrupted",
]

FINAL_STATUSES: frozenset[str] = frozenset(
    {"completed", "failed", "cancelled", "timed_out", "dead", "interrupted"}
)
"""A run in one of these has ended, once, and nothing more happens in it."""

STOP_CODES: dict[str, int] = {
    "cancelled": 409,
    "timed_out": 504,
    "failed": 500,
    "dead": 503,
    "interrupted": 503,
}
"""The status code of the ``stopped`` audit record of a run that ended without an answer (a
plain ``POST /v1/runs`` answers such a run with the same code)."""


def ending_status(result: RunResult) -> RunStatus:
    """How a run that went through to its result ends: ``completed`` when the model answered
    (fully, or partly: a ``206`` after ``max_iterations`` is an answer), ``failed`` when the run
    itself failed on the way — the model after its retries (``502``), a stage or a hook
    (``500``), input the pipeline refused (``400``), an answer that never matched the run's
    output schema (``422``); ``timed_out`` when the run's own ``run_timeout_s`` (the agent's
    budget, ``504``) stopped it. The result's ``error`` says why. A run a hook answered
    (``answered_by_hook``, a refusal included) is ``completed``, and so is one stopped by its
    token or cost budget (``budget_exceeded``, ``206``: like ``max_iterations``, it says so).

    The one mapping from a result to a run's ending, for the in-process engine and the queue's
    workers alike; it reads the same mark (``loop_status == "failed"``) that makes the agent
    leave a failed (or timed out) run's turn out of the session, so a run is ``completed``
    exactly when its turn is in the session's history."""
    if result.loop_status == "timed_out":
        return "timed_out"
    return "failed" if result.loop_status == "failed" else "completed"
