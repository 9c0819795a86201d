"""The command line in a process of its own, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def hermes(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``hermes-agent *args`` run in ``cwd``, which is its HOME too (``HERMES_DEBUG`` unset)."""
    environment = {k: v for k, v in os.environ.items() if k != "HERMES_DEBUG"}
    environment["HOME"] = str(cwd)
    return subprocess.run(
        [sys.executable, "-m", "hermes_agent", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=environment,
    )
