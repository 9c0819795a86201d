"""Progress a tool reports while it runs, for the caller that asked to hear it.

    from hermes_agent import tool
    from hermes_agent.tools.mcp import report_progress

    @tool
    def index_documents(folder: str) -> int:
        "Index every document of a folder."
        files = list_files(folder)
        for done, path in enumerate(files, 1):
            index(path)
            report_progress(done, len(files), f"indexed {path}")
        return len(files)

Over MCP (``hermes-agent mcp serve``), a ``tools/call`` whose caller sent a progress token
gets one ``notifications/progress`` per report, in order, before the result. Anywhere else
(a run of the agent's own model, a caller that asked for no progress) a report goes nowhere:
a tool reports without knowing who listens. It works from an ``async`` tool and from a sync
tool on its thread; not from a ``subprocess`` tool (its process has no way back to the caller).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token

Reporter = Callable[[float, float | None, str | None], None]
"""Takes one report: progress, total (or ``None``), message (or ``None``). Thread-safe."""

_reporter: ContextVar[Reporter | None] = ContextVar("hermes_agent_progress", default=None)


def report_progress(
    progress: float, total: float | None = None, message: str | None = None
) -> bool:
    """Report how far the current call is (``progress`` of ``total``, both numbers that grow
    with each report). ``True`` when the call came from a caller that takes reports (an MCP
    ``tools/call``, which passes them on when its caller sent a progress token), else
    ``False``."""
    reporter = _reporter.get()
    if reporter is None:
        return False
    reporter(progress, total, message)
    return True


def listen(reporter: Reporter | None) -> Token[Reporter | None]:
    """Make ``reporter`` hear the reports of the calls made from this context on (the MCP
    server does, for a call that asked for progress); ``reset`` with the token it returns."""
    return _reporter.set(reporter)


def reset(token: Token[Reporter | None]) -> None:
    _reporter.reset(token)
