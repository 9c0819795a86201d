"""``hermes-agent run``, ``chat`` and ``tools``: ask the agent, talk with it, list its tools."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Annotated

import typer
from rich.table import Table

from hermes_agent.agent import Agent
from hermes_agent.cli._common import (
    ConfigOption,
    DebugOption,
    NoDemoOption,
    ToolsOption,
    cli_agent,
    console,
    errors,
    fail,
    setup_logging,
)
from hermes_agent.errors import HermesAgentError


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
    setup_logging(debug)
    agent = cli_agent(config, tools, no_demo_tools)
    try:
        result = agent.run(
            question,
            session_id=session,
            tool_choice=tool_choice,
            dry_run=dry_run,
            output_format=output_format,
        )
    except HermesAgentError as exc:
        fail(str(exc))
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


def chat(
    config: ConfigOption = None,
    tools: ToolsOption = None,
    no_demo_tools: NoDemoOption = False,
    debug: DebugOption = False,
) -> None:
    """Talk with the agent; answers stream and tool calls show as they happen."""
    setup_logging(debug)
    agent = cli_agent(config, tools, no_demo_tools)
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


def list_tools(
    config: ConfigOption = None,
    tools: ToolsOption = None,
    no_demo_tools: NoDemoOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the schemas as JSON.")] = False,
) -> None:
    """List the tools the agent would offer the model, with their schemas."""
    agent = cli_agent(config, tools, no_demo_tools, storage=False)
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
