"""The architecture as the import contracts in pyproject.toml state it ([tool.importlinter]):
the core imports no upper layer, no import cycle between modules or packages, front doors
reach runs through the run backend and never an engine, only the CLI imports typer, channels
do not import the service. import-linter reads every import — at module level, inside
functions and under ``TYPE_CHECKING`` — so a lazy import cannot hide one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LINT = """
import sys
from importlinter.cli import lint_imports
sys.exit(lint_imports(sys.argv[1], no_cache=True, no_logo=True))
"""


def test_the_import_contracts_hold() -> None:
    # In a process of its own: the linter configures logging, which would silence the loggers
    # other tests of this process listen to.
    linted = subprocess.run(
        [sys.executable, "-c", LINT, str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "BROKEN" not in linted.stdout and " KEPT" in linted.stdout
