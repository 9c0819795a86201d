"""What every command shares: the consoles, the one way to fail, the common options, ids given
by their first characters, and the agent the options describe."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TextIO

import typer
from rich.console import Console
from rich.text import Text

from hermes_agent.agent import Agent
from hermes_agent.config import DEFAULT_STORAGE_URL, load_config
from hermes_agent.demo_tools import demo_tools
from hermes_agent.errors import ConfigError, HermesAgentError
from hermes_agent.loading import ToolsFileError, build_agent, on_owned_loops
from hermes_agent.logs import debug_from_environment, enable_debug_logging
from hermes_agent.messages import text
from hermes_agent.tools.registry import Tool
from hermes_agent.types import ToolCall

PIPE_WIDTH = 10_000
"""The console width when the output is not a terminal: wide enough that nothing is wrapped or
cut (a whole id, a one-line error), since a file or a program has no screen edge."""

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
    bool,
    typer.Option(
        "--debug",
        help="Print one line per pipeline stage and per tool call with its arguments "
        "(or HERMES_DEBUG=1 / DEBUG=1).",
    ),
]
LangOption = Annotated[
    str | None,
    typer.Option(
        "--lang",
        help="en | zh: the language of what the command prints and of the runtime's own "
        "messages (default: the config's agent.language).",
    ),
]
ToolsetsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--toolsets",
        help="Only the tools of these toolsets (repeatable, or comma-separated); "
        "overrides agent.toolsets.",
    ),
]
DEBUG_ARGUMENT_CHARS = 300
"""How much of a call's arguments a ``--debug`` line shows."""


def is_terminal(stream: TextIO) -> bool:
    """Whether a person reads ``stream`` on a terminal (not a file or a pipe)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if callable(isatty) else False


def make_console(stream: TextIO, *, markup: bool = False) -> Console:
    """A console on ``stream``. Markup, emoji codes and highlighting are off: what is printed
    is shown as it is (a model's answer, a file name, an error with ``[brackets]`` in it);
    styles are given as ``Text`` styles, never as markup in strings. Off a terminal nothing
    wraps (see ``PIPE_WIDTH``)."""
    terminal = is_terminal(stream)
    return Console(
        file=stream,
        markup=markup,
        emoji=False,
        highlight=False,
        soft_wrap=not terminal,
        width=None if terminal else PIPE_WIDTH,
    )


def out(*, markup: bool = False) -> Console:
    """The console for answers and data: standard output, as it is now (a test runner may have
    swapped it). ``markup=True`` only for renderables built by trusted code."""
    return make_console(sys.stdout, markup=markup)


def err() -> Console:
    """The console for errors, notices and progress: standard error."""
    return make_console(sys.stderr)


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line from plain parts and ``(text, style)`` parts; no markup is read from either."""
    return Text.assemble(*parts)


def fail(message: str, language: str = "en") -> NoReturn:
    """Print ``error: message`` on stderr and exit 2 (a usage or configuration error)."""
    err().print(styled((text("cli.error", language), "bold red"), message))
    raise typer.Exit(2)


def warn(message: str, language: str = "en") -> None:
    """Print ``warning: message`` on stderr (the label in ``language``)."""
    err().print(styled((text("cli.warning", language), "yellow"), message))


def config_error(config: Path | None, exc: HermesAgentError) -> str:
    """The message of ``exc``, naming the config file when it is a config problem that does
    not already name it (a model section found wanting only when the model is built)."""
    message = str(exc)
    if config is not None and isinstance(exc, ConfigError) and str(config) not in message:
        return f"{config}: {message}"
    return message


SHOWN_CANDIDATES = 10


def resolve_id(
    given: str,
    starting_with: Callable[[str, int], list[str]],
    *,
    what: str,
    missing: str,
) -> str:
    """The whole id that ``given`` names: ``given`` itself when it is one, else the one id that
    starts with it (as git takes the first characters of a commit id). ``starting_with(prefix,
    limit)`` returns the ids that start with ``prefix``. Fails (exit 2) with ``missing`` when no
    id starts so, and with the candidates when more than one does."""
    if not given:
        fail(missing)
    found = starting_with(given, SHOWN_CANDIDATES + 1)
    if given in found:
        return given
    if len(found) == 1:
        return found[0]
    if not found:
        fail(missing)
    shown = ", ".join(found[:SHOWN_CANDIDATES])
    more = ", …" if len(found) > SHOWN_CANDIDATES else ""
    fail(f"{what} id {given!r} is ambiguous: {shown}{more} start with it; give more characters")


def cli_agent(
    config: Path | None,
    tool_files: list[Path] | None,
    no_demo: bool,
    *,
    storage: bool = True,
    toolsets: list[str] | None = None,
    owned_loop: bool = False,
) -> Agent:
    """The agent the command's options describe: ``build_agent`` plus the command line's
    defaults (the demo tools, approval at the terminal, and ``.hermes/state.db`` when the
    config names no storage). ``storage=False`` for commands that only need its tools (no
    database is opened or created); ``toolsets`` (``--toolsets``) limits its tools. With
    ``--debug``, each tool call the model writes is logged with its arguments.
    ``owned_loop``: the command owns the loop its runs use and closes what they open on it
    (``serve``), so ``transport: auto`` is aiohttp (``loading.on_owned_loops``)."""
    try:
        settings = load_config(config) if config else None
        if owned_loop and settings is not None:
            settings = on_owned_loops(settings)
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
        if exc.details and debug_enabled():
            err().print(exc.details.rstrip("\n"))
        fail(f"--tools {exc.path}: {exc.problem}")
    except HermesAgentError as exc:
        fail(config_error(config, exc))
    if agent.approver is None:
        agent.approver = ask_approval
    if toolsets:
        chosen = toolset_names(toolsets)
        unknown = sorted(set(chosen) - set(agent.registry.toolsets()))
        if unknown:
            agent.close()
            known = ", ".join(sorted(agent.registry.toolsets())) or "(no tools)"
            fail(f"--toolsets: no tools in {', '.join(unknown)}; the toolsets are: {known}")
        agent.toolsets = chosen
    if debug_enabled():
        agent.add_hook("post_thought", DebugCalls(agent))
    return agent


def toolset_names(given: list[str]) -> list[str]:
    """``--toolsets a,b --toolsets c`` → ``[a, b, c]``."""
    names = [name.strip() for item in given for name in item.split(",")]
    return list(dict.fromkeys(name for name in names if name))


class DebugCalls:
    """A ``post_thought`` hook for ``--debug``: one line per tool call the model wrote, with
    its arguments as written (before they are checked: what to read when arguments are
    missing or invented), masked like the trail and cut at ``DEBUG_ARGUMENT_CHARS``."""

    def __init__(self, agent: Agent) -> None:
        self.redactor = agent.redactor

    def __call__(self, ctx: Any) -> None:
        logger = logging.getLogger("hermes_agent")
        for call in ctx.completion.tool_calls:
            shown = json.dumps(call.arguments, ensure_ascii=False, default=str)
            shown = self.redactor(" ".join(shown.split()))
            if len(shown) > DEBUG_ARGUMENT_CHARS:
                shown = shown[: DEBUG_ARGUMENT_CHARS - 1] + "…"
            logger.info("ToolCall: step=%d, name=%s, arguments=%s", ctx.step, call.name, shown)


def ask_approval(call: ToolCall, tool: Tool) -> tuple[bool, str]:
    """The CLI's approver: show the call and ask y/N on a terminal; deny when no one can answer."""
    if not sys.stdin.isatty():
        return False, "no terminal to ask for approval (non-interactive run)"
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    console = err()
    console.print(styled((tool.name, "bold yellow"), f"({arguments}) needs approval."))
    answer = console.input("Allow this call? [y/N] ").strip().lower()
    if answer in ("y", "yes"):
        return True, "approved at the terminal"
    return False, "denied at the terminal"


_debug = False


def debug_enabled() -> bool:
    """Whether this command runs with ``--debug`` (or ``HERMES_DEBUG`` / ``DEBUG`` in the
    environment): tracebacks are then printed beside the one-line errors they explain."""
    return _debug or debug_from_environment()


def setup_logging(debug: bool) -> None:
    """With ``--debug`` (or ``HERMES_DEBUG`` / ``DEBUG``), the debug lines of the library on
    stderr — the same switch and the same lines as a library user gets (``hermes_agent.logs``)."""
    global _debug
    _debug = debug
    if debug_enabled():
        enable_debug_logging()


SERVER_MODULES = ("fastapi", "uvicorn", "prometheus_client")


def require_server_extra(command: str) -> None:
    """Fail (exit 2) saying how to install the ``server`` extra when a module it brings is
    missing."""
    missing = [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        fail(
            f"`hermes-agent {command}` needs the server extra ({', '.join(missing)} is not "
            'installed): pip install -e ".[server]" in a checkout of the project '
            '(pip install "hermes-agent-core[server]" where an index holds it)'
        )
