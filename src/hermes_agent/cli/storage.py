"""``hermes-agent sessions``, ``trace`` and ``replay``: read what the storage holds.

    hermes-agent sessions list                      # the conversations, newest first
    hermes-agent sessions show SESSION_ID           # one conversation, message by message
    hermes-agent sessions delete SESSION_ID
    hermes-agent trace list                         # the latest requests
    hermes-agent trace show REQUEST_ID              # one request, stage by stage
    hermes-agent trace export REQUEST_ID -o run.jsonl
    hermes-agent replay REQUEST_ID --tools my_tools.py   # exit 0 when every step matches

Every command takes ``--db URL``; without it the ``storage.url`` of ``--config``, else the
default ``sqlite:///.hermes/state.db``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from hermes_agent.cli._common import (
    ConfigOption,
    NoDemoOption,
    ToolsOption,
    cli_agent,
    console,
    errors,
    fail,
)
from hermes_agent.config import DEFAULT_STORAGE_URL, load_config
from hermes_agent.errors import HermesAgentError
from hermes_agent.storage.replay import replay
from hermes_agent.storage.sql import SqlStorage

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help=f"Database URL (default: the config's storage.url, else {DEFAULT_STORAGE_URL}).",
    ),
]

sessions_app = typer.Typer(
    name="sessions", help="List, show and delete stored conversations.", no_args_is_help=True
)
trace_app = typer.Typer(
    name="trace",
    help="Read the audit trail: requests, their stages, JSON Lines export.",
    no_args_is_help=True,
)


@contextmanager
def opened_storage(db: str | None, config: Path | None) -> Iterator[SqlStorage]:
    """The storage the options name; a usage error (exit 2) when it cannot be opened."""
    url = db
    try:
        if url is None and config is not None:
            section = load_config(config).storage
            url = section.url if section is not None else None
        storage = SqlStorage(url or DEFAULT_STORAGE_URL)
    except HermesAgentError as exc:
        fail(str(exc))
    try:
        yield storage
    finally:
        storage.close()


# -- sessions ----------------------------------------------------------------------------


@sessions_app.command("list")
def sessions_list(
    db: DbOption = None,
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many to show.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The stored sessions, most recently updated first."""
    with opened_storage(db, config) as storage:
        found = storage.sessions.list_sessions(limit=limit)
    if as_json:
        console.print_json(json.dumps(found, ensure_ascii=False))
        return
    table = Table(title=f"Sessions ({len(found)})")
    for column in ("id", "created", "updated", "turns", "messages"):
        table.add_column(column, justify="right" if column in ("turns", "messages") else "left")
    for row in found:
        table.add_row(
            Text(row["id"]), row["created"], row["updated"], str(row["turns"]), str(row["messages"])
        )
    console.print(table)


@sessions_app.command("show")
def sessions_show(
    session_id: Annotated[str, typer.Argument(help="The session id.")],
    db: DbOption = None,
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """One conversation, message by message."""
    with opened_storage(db, config) as storage:
        messages = storage.sessions.load(session_id)
    if not messages:
        fail(f"no session {session_id!r}; list them with `hermes-agent sessions list`")
    if as_json:
        data = [_message_dict(m) for m in messages]
        console.print_json(json.dumps(data, ensure_ascii=False, default=str))
        return
    table = Table(title=f"Session {session_id}")
    table.add_column("#", justify="right")
    table.add_column("role", style="bold")
    table.add_column("content")
    for number, message in enumerate(messages):
        table.add_row(str(number), message.role, Text(_describe(message)))
    console.print(table)


@sessions_app.command("delete")
def sessions_delete(
    session_id: Annotated[str, typer.Argument(help="The session id.")],
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Forget a conversation (its audit records stay)."""
    with opened_storage(db, config) as storage:
        existed = storage.sessions.delete(session_id)
    if not existed:
        fail(f"no session {session_id!r}; nothing deleted")
    console.print(f"deleted session {session_id}", highlight=False)


# -- trace -------------------------------------------------------------------------------


@trace_app.command("list")
def trace_list(
    db: DbOption = None,
    config: ConfigOption = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many to show.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The latest recorded requests, newest first."""
    with opened_storage(db, config) as storage:
        found = storage.requests(limit=limit)
    if as_json:
        console.print_json(json.dumps(found, ensure_ascii=False))
        return
    table = Table(title=f"Requests ({len(found)})")
    for column in ("request_id", "session", "started", "steps", "status", "ms", "model"):
        table.add_column(column)
    for row in found:
        table.add_row(
            row["request_id"],
            Text(row["session_id"]),
            row["started"],
            str(row["steps"]),
            f"{row['status']} {row['status_code'] or ''}".strip(),
            f"{row['duration_ms']:.1f}",
            Text(row["model"] or ""),
        )
    console.print(table)


@trace_app.command("show")
def trace_show(
    request_id: Annotated[str, typer.Argument(help="The request id (from `trace list`).")],
    db: DbOption = None,
    config: ConfigOption = None,
    width: Annotated[int, typer.Option("--width", help="Summary length per record.")] = 120,
) -> None:
    """One request, stage by stage: step, stage, status, latency and a summary of the content."""
    with opened_storage(db, config) as storage:
        records = storage.records(request_id)
    if not records:
        fail(f"no audit records for request {request_id!r}; see `hermes-agent trace list`")
    first = records[0]
    table = Table(
        title=f"Request {request_id}",
        caption=(
            f"session {escape(first.session_id)} · model {escape(first.model_name)} · "
            f"system prompt sha256 {first.system_prompt_sha256[:12]}"
        ),
    )
    table.add_column("step", justify="right")
    table.add_column("stage", style="bold")
    table.add_column("role")
    table.add_column("status")
    table.add_column("latency ms", justify="right")
    table.add_column("summary")
    for record in records:
        style = "red" if record.status == "error" else "green"
        table.add_row(
            str(record.step),
            record.stage,
            record.role,
            f"[{style}]{record.status_code}[/{style}]",
            f"{record.latency_ms:.2f}",
            Text(_clip(record.content, width)),
        )
    console.print(table)


@trace_app.command("export")
def trace_export(
    request_id: Annotated[str, typer.Argument(help="The request id (from `trace list`).")],
    db: DbOption = None,
    config: ConfigOption = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
) -> None:
    """The request's records as JSON Lines, one record per line, every field (lossless)."""
    with opened_storage(db, config) as storage:
        exported = storage.export_jsonl(request_id)
    if not exported:
        fail(f"no audit records for request {request_id!r}; see `hermes-agent trace list`")
    if output is None:
        typer.echo(exported, nl=False)
    else:
        output.write_text(exported, encoding="utf-8")
        errors.print(f"wrote {exported.count(chr(10))} records to {output}", highlight=False)


# -- replay ------------------------------------------------------------------------------


def replay_command(
    request_id: Annotated[str, typer.Argument(help="The request id (from `trace list`).")],
    db: DbOption = None,
    config: ConfigOption = None,
    tools: ToolsOption = None,
    no_demo_tools: NoDemoOption = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every step.")] = False,
) -> None:
    """Re-run a recorded request with its recorded model answers against the current tools and
    prompts; exit 0 when every step matches, 1 when one differs (the first is printed)."""
    agent = cli_agent(config, tools, no_demo_tools, storage=False)  # the one `run` would build
    try:
        with opened_storage(db, config) as storage:
            try:
                report = replay(agent, request_id, storage)
            except HermesAgentError as exc:
                fail(str(exc))
    finally:
        agent.close()
    if verbose or not report.matched:
        console.print(report.summary(), highlight=False, markup=False)
    else:
        console.print(report.summary().splitlines()[0], highlight=False, markup=False)
    if not report.matched:
        step = next(s for s in report.steps if not s.matched)
        errors.print(
            f"first difference at step {step.step}: {step.differences[0]}",
            highlight=False,
            markup=False,
        )
    raise typer.Exit(0 if report.matched else 1)


def _message_dict(message: Any) -> dict[str, Any]:
    return {
        "role": message.role,
        "content": message.content,
        "tool_calls": [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls
        ],
        "tool_results": [
            {"call_id": r.call_id, "name": r.name, "content": r.content, "status": r.status_code}
            for r in message.tool_results
        ],
    }


def _describe(message: Any) -> str:
    parts = [message.content] if message.content else []
    parts += [
        f"→ {c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in message.tool_calls
    ]
    parts += [
        f"← {r.name} [{r.status_code}] {json.dumps(r.content, ensure_ascii=False, default=str)}"
        for r in message.tool_results
    ]
    return _clip("\n".join(parts), 300)


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
