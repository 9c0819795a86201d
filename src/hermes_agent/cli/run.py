"""``hermes-agent run``, ``chat`` and ``tools``: ask the agent, talk with it, list its tools.

The answer goes to standard output; what happened on the way (each tool call as ``✓``/``✗``
lines, warnings, errors) to standard error, so ``hermes-agent run "..." > answer.txt`` keeps
only the answer.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from hermes_agent.agent import Agent
from hermes_agent.cli._common import (
    ConfigOption,
    DebugOption,
    LangOption,
    NoDemoOption,
    ToolsetsOption,
    ToolsOption,
    cli_agent,
    err,
    fail,
    is_terminal,
    out,
    setup_logging,
    styled,
    warn,
)
from hermes_agent.errors import HermesAgentError, OutputValidationError
from hermes_agent.events import (
    ResultEvent,
    TextDeltaEvent,
    ToolCallParsedEvent,
    ToolResultsEvent,
)
from hermes_agent.messages import language_of, text
from hermes_agent.models.llamacpp import LlamaCpp
from hermes_agent.types import RunResult, ToolCallRecord

_SHOWN_RESULT_CHARS = 200


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
    output_schema: Annotated[
        Path | None,
        typer.Option(
            "--output-schema",
            help="JSON Schema file: the answer is JSON that validates against it.",
        ),
    ] = None,
    toolsets: ToolsetsOption = None,
    no_demo_tools: NoDemoOption = False,
    lang: LangOption = None,
    debug: DebugOption = False,
) -> None:
    """Answer one question, calling tools as needed. The answer goes to stdout; the tool calls
    (✓ ran, ✗ failed, with the result or the error), warnings and errors to stderr. With
    --output-schema the answer is the validated JSON (exit 1 when the model never gave one)."""
    setup_logging(debug)
    schema = _read_schema(output_schema) if output_schema is not None else None
    agent = cli_agent(config, tools, no_demo_tools, toolsets=toolsets)
    language = _language(agent, lang)
    try:
        result = agent.run(
            question,
            session_id=session,
            tool_choice=tool_choice,
            dry_run=dry_run,
            output_format=output_format,
            output_type=schema,
            variables={"lang": language},
        )
    except OutputValidationError as exc:
        result = exc.result  # reported below like any failed run: status 422 and why
    except HermesAgentError as exc:
        fail(str(exc), language)
    finally:
        agent.close()
    if as_json:
        out().print_json(json.dumps(result.to_dict(), ensure_ascii=False, default=str))
        if dry_run:
            err().print(_plan_headline(result, language))
    elif dry_run:
        _print_plan(result, language)
    else:
        _print_answer(result, language)
    raise typer.Exit(0 if result.status < 400 else 1)


def _language(agent: Agent, lang: str | None) -> str:
    """``--lang`` when given, else the agent's (the config's ``agent.language``)."""
    if lang is not None and language_of(lang, "") == "":
        fail(f"--lang {lang}: use en or zh")
    return language_of(lang, agent.language)


def _read_schema(path: Path) -> dict[str, Any]:
    """The JSON Schema in ``path``, or a usage error (exit 2) saying what is wrong with it."""
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        fail(f"--output-schema {path}: cannot read it ({exc.strerror})")
    except json.JSONDecodeError as exc:
        fail(f"--output-schema {path}: not valid JSON: {exc}")
    if not isinstance(schema, dict):
        fail(f"--output-schema {path}: a JSON Schema must be a JSON object")
    return schema


def _print_answer(result: RunResult, language: str = "en") -> None:
    errors = err()
    for call in result.tool_calls:
        errors.print(_call_line(call), style="dim")
    for warning in result.warnings:
        warn(warning, language)
    if result.status >= 400:
        _print_failure(result, language)
        return
    if result.status == 206:
        why = result.loop_status.replace("_", " ")
        warn(text("cli.partial", language, why=why), language)
    shown = result.rendered.content if result.rendered is not None else result.output
    out().print(shown)


def _print_failure(result: RunResult, language: str) -> None:
    label = text("cli.error", language)
    err().print(styled((label, "bold red"), f"{result.status} {_failure(result, language)}"))


def _print_plan(result: RunResult, language: str = "en") -> None:
    """A dry run says that it was one and what the model planned, valid or refused (stdout);
    the model's text, if it wrote any, follows."""
    console = out()
    console.print(_plan_headline(result, language))
    for call in result.tool_calls:
        console.print(f"  {_call_line(call, planned=True)}")
    if result.status >= 400:
        _print_failure(result, language)
        return
    if result.output.strip():
        console.print(result.output)


def _plan_headline(result: RunResult, language: str = "en") -> str:
    planned = sum(1 for call in result.tool_calls if call.error is None)
    refused = len(result.tool_calls) - planned
    if not result.tool_calls:
        return text("cli.dry_run_none", language)
    counts = text("cli.valid_calls", language, count=planned, s="s" if planned != 1 else "")
    if refused:
        counts += text("cli.refused_calls", language, count=refused)
    return text("cli.dry_run", language, counts=counts)


def _call_line(call: ToolCallRecord, *, planned: bool = False) -> str:
    """``✓ name(arguments) → result`` for a call that ran (or, planned, would run), ``✗
    name(arguments) → status error`` for one that failed or was refused."""
    head = f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)})"
    if call.error is not None:
        return f"✗ {head} → {call.status_code} {_one_line(call.error)}"
    if planned:
        return f"✓ {head}"
    shown = json.dumps(call.result, ensure_ascii=False, default=str)
    return f"✓ {head} → {_clip(shown, _SHOWN_RESULT_CHARS)}"


def _failure(result: RunResult, language: str = "en") -> str:
    """What went wrong: the output when it is in the run's language (the runtime translated
    it, with the detail), else the error."""
    if language != "en" and result.output and result.output != result.error:
        return _one_line(result.output)
    return _one_line(result.error or result.output or text("cli.run_failed", language))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- chat --------------------------------------------------------------------------------

CHAT_COMMANDS = {
    "/help": "cli.cmd_help",
    "/exit": "cli.cmd_exit",
    "/quit": "cli.cmd_quit",
}
"""A chat command → the key of what it does (``hermes_agent.messages``)."""
_COMMAND = re.compile(r"/[A-Za-z]+")


def chat(
    config: ConfigOption = None,
    tools: ToolsOption = None,
    toolsets: ToolsetsOption = None,
    no_demo_tools: NoDemoOption = False,
    lang: LangOption = None,
    debug: DebugOption = False,
) -> None:
    """Talk with the agent; answers stream and tool calls show as they happen. /help lists the
    chat's commands; /exit, /quit or Ctrl-D leaves."""
    setup_logging(debug)
    agent = cli_agent(config, tools, no_demo_tools, toolsets=toolsets)
    language = _language(agent, lang)
    try:
        _load_model(agent, language)
    except HermesAgentError as exc:
        agent.close()
        fail(str(exc), language)
    session_id = uuid.uuid4().hex
    console = out()
    console.print(
        styled(("Hermes Agent", "bold")),
        text("cli.chat_banner", language, session=session_id),
        sep="",
    )
    error_label = styled((text("cli.error", language), "bold red"))
    try:
        while True:
            try:
                message = console.input(styled((text("cli.you", language), "bold cyan"))).strip()
            except (EOFError, KeyboardInterrupt):
                console.print()
                break
            if not message:
                continue
            if _COMMAND.fullmatch(message):
                if message in ("/exit", "/quit"):
                    break
                if message == "/help":
                    for name, meaning in CHAT_COMMANDS.items():
                        console.print(f"  {name:<7} {text(meaning, language)}")
                    console.print(f"  {text('cli.help_other', language)}")
                else:
                    unknown = text("cli.unknown_command", language, command=message)
                    err().print(error_label, unknown, sep="")
                continue
            try:
                asyncio.run(_stream_one(agent, message, session_id, language))
            except HermesAgentError as exc:
                err().print(error_label, str(exc), sep="")
    finally:
        agent.close()


def _load_model(agent: Agent, language: str = "en") -> None:
    """Load the embedded model before the first prompt, saying so: it takes from under a second
    (the bundled 135M model) to a minute (a large GGUF), and a chat that sits silent meanwhile
    looks hung. A spinner on a terminal, one line before and one after elsewhere. Endpoint
    models have nothing to load."""
    models = [agent.model, agent.answer_model]
    local = [m for m in models if isinstance(m, LlamaCpp)]
    if not local:
        return
    console = err()
    for model in local:
        name = Path(model.model_path).name
        started = time.monotonic()
        if is_terminal(sys.stderr):
            with console.status(text("cli.loading", language, name=name)):
                model.llama  # noqa: B018 - loads it (shared by every LlamaCpp of this file)
        else:
            console.print(text("cli.loading", language, name=name))
            model.llama  # noqa: B018
        seconds = time.monotonic() - started
        console.print(text("cli.loaded", language, name=name, seconds=seconds), style="dim")


async def _stream_one(agent: Agent, message: str, session_id: str, language: str = "en") -> None:
    console = out()
    prompt = styled((text("cli.agent", language), "bold green"))
    console.print(prompt, end="")
    streamed_text = False
    variables = {"lang": language}
    async for event in agent.astream(message, session_id=session_id, variables=variables):
        if isinstance(event, TextDeltaEvent):
            streamed_text = True
            console.print(event.text, end="")
        elif isinstance(event, ToolCallParsedEvent) and event.name:
            arguments = json.dumps(event.arguments, ensure_ascii=False)
            console.print(styled(("\n→ ", "yellow"), (f"{event.name}({arguments})", "yellow")))
        elif isinstance(event, ToolResultsEvent):
            for item in event.results:
                content = _clip(json.dumps(item.content, ensure_ascii=False, default=str), 200)
                console.print(f"← {item.name} [{item.status}] {content}", style="dim")
            console.print(prompt, end="")
            streamed_text = False
        elif isinstance(event, ResultEvent):
            _end_of_turn(event.result, streamed_text, language)


def _end_of_turn(result: RunResult, streamed_text: bool, language: str = "en") -> None:
    console = out()
    if result.status >= 400:
        console.print()
        _print_failure(result, language)
    elif streamed_text and result.status == 200:
        console.print()  # the streamed text already was the answer
    else:
        console.print(f"\n{result.output}" if streamed_text else result.output)


# -- tools -------------------------------------------------------------------------------


def list_tools(
    config: ConfigOption = None,
    tools: ToolsOption = None,
    no_demo_tools: NoDemoOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the schemas as JSON.")] = False,
) -> None:
    """List the tools the agent would offer the model, with their schemas."""
    agent = cli_agent(config, tools, no_demo_tools, storage=False)
    specs: list[dict[str, Any]] = [tool.spec() for tool in agent.tools]
    if as_json:
        out().print_json(json.dumps(specs, ensure_ascii=False))
        return
    table = Table(title=text("cli.tools", agent.language))
    table.add_column("name", style="bold", no_wrap=True)
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
    out().print(table)
