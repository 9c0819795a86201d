"""The one vocabulary of a run's status, in process and on the queue.

=====================  =======================================================================
status                 meaning
=====================  =======================================================================
``queued``             admitted, waiting for a worker (queue only)
``running``            a model turn or a tool call is under way
``waiting_approval``   a tool call waits for its owner's answer (on the queue it holds no worker)
``completed``          the run answered (its result says with which status code)
``failed``             the run itself failed: the model, a tool, a hook (``error`` says why)
``cancelled``          its owner, an operator or a shutdown cancelled it
``timed_out``          it ran past ``run_timeout_s``
``dead``               its deliveries were used up without an ending (queue only)
``interrupted``        the process that ran it died; nobody will finish it
=====================  =======================================================================
"""

from __future__ import annotations

from typing import Literal

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
