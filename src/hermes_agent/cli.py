"""The ``hermes-agent`` command: run one question, chat, or list the tools.

    hermes-agent run "What is 17 * 23?"          # embedded model + demo tools, offline
    hermes-agent run --json --tool-choice required "What is 17 * 23?"
    hermes-agent run --config config.yaml --tools my_tools.py "..."
    hermes-agent chat                            # interactive, streaming
    hermes-agent tools                           # the tools and their schemas

Exit codes: 0 when the run produced an answer (status 200 or 206), 1 when it failed (4xx/5xx),
2 for a usage or configuration error. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from hermes_agent.agent import Agent
from hermes_agent.config import DEFAULT_STORAGE_URL
from hermes_agent.demo_tools import demo_tools
from hermes_agent.errors import HermesAgentError
from hermes_agent.tools.registry import Tool
from hermes_agent.types import ToolCall

app = typer.Typer(
    name="hermes-agent",
    help="Hermes Agent: run function-calling models that speak the Hermes protocol.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
errors = Console(stderr=True)

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config file (model, agent).")
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


def main() -> None:
    """Console-script entry point."""
    app()


@app.command()
def run(
    question: Annotated[str, typer.Argument(help="The message for the agent.")],
    config: ConfigOption = None,
    tools: ToolsOption = None,
    tool_choice: Annotated[
        str | None,
        typer.Option("--tool-choice", help="auto | required | none | <tool name>."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the RunResult as JSON.")] = False,
    session: Annotated[str | None, typer.Option("--session", help="Session id.")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Plan and validate the calls; run no tool.")
    ] = False,
    output_format: Annotated[
        str | None,
        typer.Option("--format", help="text | markdown | json | table | a custom renderer."),
    ] = None,
    no_demo_tools: NoDemoOption = False,
    debug: DebugOption = False,
) -> None:
    """Answer one question, calling tools as needed."""
    _setup_logging(debug)
    agent = _build_agent(config, tools, no_demo_tools)
    try:
        result = agent.run(
            question,
            session_id=session,
            tool_choice=tool_choice,
            dry_run=dry_run,
            output_format=output_format,
        )
    except HermesAgentError as exc:
        _fail(str(exc))
    if as_json:
        console.print_json(json.dumps(result.to_dict(), ensure_ascii=False, default=str))
    else:
        for call in result.tool_calls:
            mark = "✓" if call.error is None else f"✗ {call.status_code}"
            errors.print(
                f"[dim]{mark} {call.name}({json.dumps(call.arguments, ensure_ascii=False)})"
                f" → {json.dumps(call.result, ensure_ascii=False, default=str)[:200]}[/dim]",
                highlight=False,
            )
        if result.loop_status == "dry_run_complete":
            errors.print("[dim]dry run: no tool was called[/dim]")
        shown = result.rendered.content if result.rendered is not None else result.output
        console.print(shown, highlight=False, markup=False)
    raise typer.Exit(0 if result.status < 400 else 1)


@app.command()
def chat(
    config: ConfigOption = None,
    tools: ToolsOption = None,
    no_demo_tools: NoDemoOption = False,
    debug: DebugOption = False,
) -> None:
    """Talk with the agent; answers stream and tool calls show as they happen."""
    _setup_logging(debug)
    agent = _build_agent(config, tools, no_demo_tools)
    session_id = uuid.uuid4().hex
    console.print(f"[bold]Hermes Agent[/bold] — session {session_id[:8]}; /exit or Ctrl-D to quit")
    while True:
        try:
            message = console.input("[bold cyan]you>[/bold cyan] ")
        except (EOFError, KeyboardInterrupt):
            console.print()
            break
        if message.strip() in ("/exit", "/quit"):
            break
        if not message.strip():
            continue
        try:
            asyncio.run(_stream_one(agent, message, session_id))
        except HermesAgentError as exc:
            errors.print(f"[red]error:[/red] {exc}", highlight=False)


async def _stream_one(agent: Agent, message: str, session_id: str) -> None:
    console.print("[bold green]agent>[/bold green] ", end="")
    streamed_text = False
    async for event in agent.astream(message, session_id=session_id):
        if event.kind == "text_delta":
            streamed_text = True
            console.print(event.data["text"], end="", highlight=False, markup=False)
        elif event.kind == "tool_call_parsed" and event.data.get("name"):
            arguments = json.dumps(event.data["arguments"], ensure_ascii=False)
            console.print(f"\n[yellow]→ {event.data['name']}({arguments})[/yellow]")
        elif event.kind == "tool_results":
            for item in event.data["results"]:
                content = json.dumps(item["content"], ensure_ascii=False, default=str)[:200]
                console.print(f"[dim]← {item['name']} [{item['status']}] {content}[/dim]")
            console.print("[bold green]agent>[/bold green] ", end="")
            streamed_text = False
        elif event.kind == "result":
            result = event.data["result"]
            # The streamed text already is the answer unless the run ended otherwise.
            if streamed_text and result.status == 200:
                console.print()
            else:
                console.print(f"\n{result.output}", highlight=False, markup=False)


@app.command("tools")
def list_tools(
    config: ConfigOption = None,
    tools: ToolsOption = None,
    no_demo_tools: NoDemoOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the schemas as JSON.")] = False,
) -> None:
    """List the tools the agent would offer the model, with their schemas."""
    agent = _build_agent(config, tools, no_demo_tools, storage=False)
    if as_json:
        console.print_json(json.dumps([tool.spec() for tool in agent.tools], ensure_ascii=False))
        return
    table = Table(title="Tools")
    table.add_column("name", style="bold")
    table.add_column("toolset")
    table.add_column("description")
    table.add_column("parameters")
    for tool in agent.tools:
        table.add_row(
            tool.name,
            tool.toolset,
            tool.description.split("\n")[0],
            json.dumps(tool.parameters, ensure_ascii=False, indent=1),
        )
    console.print(table)


def ask_approval(call: ToolCall, tool: Tool) -> tuple[bool, str]:
    """The CLI's approver: show the call and ask y/N on a terminal; deny when no one can answer."""
    if not sys.stdin.isatty():
        return False, "no terminal to ask for approval (non-interactive run)"
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    errors.print(f"[bold yellow]{tool.name}[/bold yellow]({arguments}) needs approval.")
    answer = errors.input("Allow this call? [y/N] ").strip().lower()
    return (
        (True, "approved at the terminal")
        if answer in ("y", "yes")
        else (
            False,
            "denied at the terminal",
        )
    )


def _build_agent(
    config: Path | None, tool_files: list[Path] | None, no_demo: bool, *, storage: bool = True
) -> Agent:
    """The agent the command describes; ``storage=False`` for commands that only need its
    tools (no database is opened or created)."""
    try:
        if config:
            agent = (
                Agent.from_config(config) if storage else Agent.from_config(config, storage=None)
            )
        else:
            agent = Agent(storage=DEFAULT_STORAGE_URL if storage else None)
        if agent.approver is None:
            agent.approver = ask_approval
        if not no_demo:
            for tool in demo_tools():
                agent.add_tool(tool)
        for path in tool_files or []:
            for tool in load_tools_file(path):
                agent.add_tool(tool, replace=True)
    except HermesAgentError as exc:
        _fail(str(exc))
    return agent


def load_tools_file(path: Path) -> list[Tool]:
    """The tools a Python file defines: every ``Tool`` at module level (made with
    ``@hermes_agent.tool``), plus the functions or Tools listed in a ``TOOLS`` variable."""
    if not path.is_file():
        raise HermesAgentError(f"--tools {path}: no such file")
    module_name = f"hermes_user_tools_{abs(hash(path.resolve()))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise HermesAgentError(f"--tools {path}: cannot import it as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise HermesAgentError(
            f"--tools {path}: importing it failed: {type(exc).__name__}: {exc}"
        ) from exc
    found: dict[str, Tool] = {}
    for value in vars(module).values():
        if isinstance(value, Tool):
            found[value.name] = value
    for item in getattr(module, "TOOLS", []):
        made = item if isinstance(item, Tool) else Tool.from_function(item)
        found[made.name] = made
    if not found:
        raise HermesAgentError(
            f"--tools {path}: no tools found; decorate functions with @hermes_agent.tool "
            "or list them in TOOLS = [...]"
        )
    return list(found.values())


def _setup_logging(debug: bool) -> None:
    if not (debug or os.environ.get("HERMES_DEBUG", "") not in ("", "0", "false")):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
    logger = logging.getLogger("hermes_agent")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _fail(message: str) -> Any:
    errors.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(2)


from hermes_agent.evals.cli import eval_command  # noqa: E402  (registered after the app exists)

app.command("eval")(eval_command)

from hermes_agent.storage.cli import (  # noqa: E402  (registered after the app exists)
    replay_command,
    sessions_app,
    trace_app,
)

app.add_typer(sessions_app)
app.add_typer(trace_app)
app.command("replay")(replay_command)
