"""Whether a process still runs, for the tests that check that a killed tool, sandbox or
service process is gone (``test_cancel_tools``, ``test_sandbox_hardening``, ``test_pipeline``,
``test_server_shutdown``)."""

from __future__ import annotations

import time


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie, or a process dead and being reaped, does not. Its
    ``/proc`` entry can go while it is read (the read fails with ``ProcessLookupError``):
    that process is gone too."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def gone_within(pid: int, seconds: float) -> bool:
    """Whether ``pid`` stops running within ``seconds`` (a killed process needs a moment)."""
    until = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > until:
            return False
        time.sleep(0.01)  # the polling pace, bounded by until
    return True
