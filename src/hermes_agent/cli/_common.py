"""What every command shares: the consoles, the one way to fail, the common options, and the
agent the options describe."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from hermes_agent.agent import Agent
from hermes_agent.config import DEFAULT_STORAGE_URL, load_config
from hermes_agent.demo_tools import demo_tools
from hermes_agent.errors import HermesAgentError
from hermes_agent.loading import ToolsFileError, build_agent
from hermes_agent.tools.registry import Tool
from hermes_agent.types import ToolCall

console = Console()
errors = Console(stderr=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file (model, agent, storage)."),
]
ToolsOption = Annotated[
    list[Path] | None,
    typer.Option("--tools", "-t", help="Python file whose tools to load (repeatable)."),
]
NoDemoOption = Annotated[
    bool, typer.Option("--no-demo-tools", help="Do not add the built-in demo tools.")
]
DebugOption = Annotated[
    bool, typer.Option("--debug", help="Print one line per pipeline stage (or HERMES_DEBUG=1).")
]


def fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit 2 (a usage or configuration error)."""
    errors.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(2)


def cli_agent(
    config: Path | None, tool_files: list[Path] | None, no_demo: bool, *, storage: bool = True
) -> Agent:
    """The agent the command's options describe: ``build_agent`` plus the command line's
    defaults (the demo tools, approval at the terminal, and ``.hermes/state.db`` when the
    config names no storage). ``storage=False`` for commands that only need its tools (no
    database is opened or created)."""
    try:
        settings = load_config(config) if config else None
        overrides: dict[str, Any] = {}
        if not storage:
            overrides["storage"] = None
        elif settings is None or settings.storage is None:
            # The command line keeps sessions and the trail, so `sessions` and `trace` have
            # something to show; the library stores only where it is told.
            overrides["storage"] = DEFAULT_STORAGE_URL
        if not no_demo:
            overrides["tools"] = demo_tools()  # first, so a --tools file may replace one
        agent = build_agent(settings, tools_files=tool_files or (), **overrides)
    except ToolsFileError as exc:
        fail(f"--tools {exc.path}: {exc.problem}")
    except HermesAgentError as exc:
        fail(str(exc))
    if agent.approver is None:
        agent.approver = ask_approval
    return agent


def ask_approval(call: ToolCall, tool: Tool) -> tuple[bool, str]:
    """The CLI's approver: show the call and ask y/N on a terminal; deny when no one can answer."""
    if not sys.stdin.isatty():
        return False, "no terminal to ask for approval (non-interactive run)"
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    errors.print(f"[bold yellow]{tool.name}[/bold yellow]({arguments}) needs approval.")
    answer = errors.input("Allow this call? [y/N] ").strip().lower()
    if answer in ("y", "yes"):
        return True, "approved at the terminal"
    return False, "denied at the terminal"


def setup_logging(debug: bool) -> None:
    """With ``--debug`` or ``HERMES_DEBUG``, one ``[INFO]`` line per pipeline stage on stderr."""
    if not (debug or os.environ.get("HERMES_DEBUG", "") not in ("", "0", "false")):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    logger = logging.getLogger("hermes_agent")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
