"""The architecture as the import contracts in pyproject.toml state it ([tool.importlinter]):
the core imports no upper layer, no import cycle between modules or packages, front doors
reach runs through the run backend and never an engine, only the CLI imports typer, channels
do not import the service. import-linter reads every import — at module level, inside
functions and under ``TYPE_CHECKING`` — so a lazy import cannot hide one."""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_hold() -> None:
    assert lint_imports(str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True) == 0
