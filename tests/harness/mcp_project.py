"""A project folder for ``hermes-agent mcp serve`` as the MCP server tests start it: a tools file
(two plain tools, two that need approval; each call it serves is written to ``ran.txt``) and a
config (a scripted model, a SQLite store)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

TOOLS = '''
from pathlib import Path
from hermes_agent import tool

RAN = Path(__file__).with_name("ran.txt")


def _ran(name: str) -> None:
    with RAN.open("a") as file:
        file.write(name + "\\n")


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    _ran("multiply")
    return a * b


@tool
def profile(name: str) -> dict:
    """A user's profile."""
    _ran("profile")
    return {"name": name, "plan": "pro"}


@tool(requires_approval=True)
def delete_file(path: str) -> str:
    """Delete a file."""
    _ran("delete_file")
    return f"deleted {path}"


@tool(requires_approval=True)
def drop_table(table: str) -> str:
    """Drop a database table."""
    _ran("drop_table")
    return f"dropped {table}"
'''


def make_project(tmp_path: Path) -> Path:
    """A folder with the tools file and a config (scripted model, SQLite store)."""
    (tmp_path / "tools.py").write_text(TOOLS, encoding="utf-8")
    config = f"""
        model:
          provider: scripted
          responses: ["The answer is 42.", "Still 42."]
        storage:
          url: sqlite:///{tmp_path / "state.db"}
    """
    (tmp_path / "config.yaml").write_text(textwrap.dedent(config), encoding="utf-8")
    return tmp_path


@pytest.fixture(name="project")
def project_fixture(tmp_path: Path) -> Path:
    """``make_project`` in the test's tmp_path."""
    return make_project(tmp_path)
