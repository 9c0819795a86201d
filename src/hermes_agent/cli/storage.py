"""``hermes-agent sessions``, ``trace``, ``replay`` and ``db``: read what the storage holds, and
keep its schema up to date.

    hermes-agent sessions list                      # the conversations, newest first
    hermes-agent sessions show SESSION_ID           # one conversation, message by message
    hermes-agent sessions delete SESSION_ID
    hermes-agent trace list                         # the latest requests
    hermes-agent trace show REQUEST_ID              # one request, stage by stage, and its thoughts
    hermes-agent trace export REQUEST_ID -o run.jsonl
    hermes-agent replay REQUEST_ID --tools my_tools.py   # exit 0 when every step matches
    hermes-agent db upgrade                         # apply the schema's migrations now
    hermes-agent db version                         # the schema version, changing nothing

Every command takes ``--db URL``; without it the ``storage.url`` of ``--config``, else the
default ``sqlite:///.hermes/state.db``. A request id (``trace show``, ``trace export``,
``replay``) or a session id to show may be given by its first characters, as long as no other id
starts with them (as git takes commit ids); the tables print whole ids when their output is not
a terminal.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from hermes_agent.audit.records import AuditRecord, records_to_jsonl
from hermes_agent.audit.trace_view import StepTrace, trace_view
from hermes_agent.cli._common import (
    ConfigOption,
    NoDemoOption,
    ToolsOption,
    cli_agent,
    config_error,
    err,
    fail,
    out,
    resolve_id,
)
from hermes_agent.config import DEFAULT_STORAGE_URL, load_config
from hermes_agent.errors import HermesAgentError
from hermes_agent.replay import replay
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.types import Message

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
db_app = typer.Typer(
    name="db",
    help="The database schema: apply its migrations, show its version.",
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
        fail(config_error(config, exc))
    try:
        yield storage
    finally:
        storage.close()


# -- ids given by their first characters ---------------------------------------------------


def request_records(storage: SqlStorage, given: str) -> tuple[str, list[AuditRecord]]:
    """The whole request id ``given`` names (itself or a unique prefix) and its records."""
    records = storage.records(given)  # a whole id: one indexed lookup
    if records:
        return given, records
    request_id = resolve_id(
        given,
        storage.request_ids_with_prefix,
        what="request",
        missing=f"no audit records for request {given!r} (a whole id or its first characters); "
        "see `hermes-agent trace list`",
    )
    return request_id, storage.records(request_id)


def session_messages(storage: SqlStorage, given: str) -> tuple[str, list[Message]]:
    """The whole session id ``given`` names (itself or a unique prefix) and its messages."""
    messages = storage.sessions.load(given)
    if messages:
        return given, messages
    session_id = resolve_id(
        given,
        storage.sessions.session_ids_with_prefix,
        what="session",
        missing=f"no session {given!r} (a whole id or its first characters); "
        "see `hermes-agent sessions list`",
    )
    return session_id, storage.sessions.load(session_id)


def _id_column(table: Table, name: str) -> None:
    # An id is never wrapped over lines: whole off a terminal (the console is wide there), cut
    # with … on a narrow terminal, where its first characters still name it.
    table.add_column(name, no_wrap=True, overflow="ellipsis")


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
        out().print_json(json.dumps(found, ensure_ascii=False))
        return
    table = Table(title=f"Sessions ({len(found)})")
    _id_column(table, "id")
    for column in ("created", "updated", "turns", "messages"):
        table.add_column(column, justify="right" if column in ("turns", "messages") else "left")
    for row in found:
        table.add_row(
            row["id"], row["created"], row["updated"], str(row["turns"]), str(row["messages"])
        )
    out().print(table)


@sessions_app.command("show")
def sessions_show(
    session_id: Annotated[str, typer.Argument(help="The session id, or its first characters.")],
    db: DbOption = None,
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """One conversation, message by message."""
    with opened_storage(db, config) as storage:
        session_id, messages = session_messages(storage, session_id)
    if as_json:
        data = [_message_dict(m) for m in messages]
        out().print_json(json.dumps(data, ensure_ascii=False, default=str))
        return
    table = Table(title=f"Session {session_id}")
    table.add_column("#", justify="right")
    table.add_column("role", style="bold")
    table.add_column("content")
    for number, message in enumerate(messages):
        table.add_row(str(number), message.role, _describe(message))
    out().print(table)


@sessions_app.command("delete")
def sessions_delete(
    session_id: Annotated[str, typer.Argument(help="The whole session id.")],
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Forget a conversation (its audit records stay). Takes the whole id: deleting is not done
    on a guess."""
    with opened_storage(db, config) as storage:
        existed = storage.sessions.delete(session_id)
        near = [] if existed else storage.sessions.session_ids_with_prefix(session_id, 2)
    if not existed:
        hint = f"; did you mean {near[0]}?" if len(near) == 1 else ""
        fail(f"no session {session_id!r}; nothing deleted (give the whole id){hint}")
    out().print(f"deleted session {session_id}")


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
        out().print_json(json.dumps(found, ensure_ascii=False))
        return
    table = Table(title=f"Requests ({len(found)})")
    _id_column(table, "request_id")
    _id_column(table, "session")
    for column in ("started", "steps", "status", "ms", "model"):
        table.add_column(column)
    for row in found:
        table.add_row(
            row["request_id"],
            row["session_id"],
            row["started"],
            str(row["steps"]),
            f"{row['status']} {row['status_code'] or ''}".strip(),
            f"{row['duration_ms']:.1f}",
            row["model"] or "",
        )
    out().print(table)


@trace_app.command("show")
def trace_show(
    request_id: Annotated[
        str, typer.Argument(help="The request id (from `trace list`), or its first characters.")
    ],
    db: DbOption = None,
    config: ConfigOption = None,
    width: Annotated[int, typer.Option("--width", help="Summary length per record.")] = 120,
) -> None:
    """One request, stage by stage: step, stage, status, latency and a summary of the content;
    then each step's thought (a thinking model's <think> text) in full, with what the parser saw
    in it and did not run."""
    with opened_storage(db, config) as storage:
        request_id, records = request_records(storage, request_id)
    trace = trace_view(records)
    # A run the service accepted and has not started yet has only the service's record.
    model = trace.model if trace.model is not None else records[0].model_name
    sha = trace.system_prompt_sha256 or records[0].system_prompt_sha256
    table = Table(
        title=f"Request {request_id}",
        caption=f"session {trace.session_id} · model {model} · system prompt sha256 {sha[:12]}",
    )
    table.add_column("step", justify="right")
    table.add_column("stage", style="bold")
    table.add_column("role")
    table.add_column("status")
    table.add_column("latency ms", justify="right")
    table.add_column("summary")
    for record in trace.records:
        table.add_row(
            str(record.step),
            record.stage,
            record.role,
            Text(str(record.status_code), style="red" if record.status == "error" else "green"),
            f"{record.latency_ms:.2f}",
            _clip(record.content, width),
        )
    out().print(table)
    _print_thoughts(trace.steps)


def _print_thoughts(steps: Sequence[StepTrace]) -> None:
    # The table clips each completion to one line, which hides the thought among the calls and
    # the answer; read apart, as the parser reads it, it is printed whole and as written.
    console = out()
    for step in steps:
        if step.thought is None and not step.notes:
            continue
        console.print(Text(f"step {step.step} · thought", style="bold"))
        if step.thought is not None:
            console.print(Text(step.thought))
        for note in step.notes:
            console.print(Text(f"note: {note}", style="yellow"))


@trace_app.command("export")
def trace_export(
    request_id: Annotated[
        str, typer.Argument(help="The request id (from `trace list`), or its first characters.")
    ],
    db: DbOption = None,
    config: ConfigOption = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
) -> None:
    """The request's records as JSON Lines, one record per line, every field (lossless)."""
    with opened_storage(db, config) as storage:
        _, records = request_records(storage, request_id)
    exported = records_to_jsonl(records)
    if output is None:
        typer.echo(exported, nl=False)
    else:
        output.write_text(exported, encoding="utf-8")
        err().print(f"wrote {len(records)} records to {output}")


# -- replay ------------------------------------------------------------------------------


def replay_command(
    request_id: Annotated[
        str, typer.Argument(help="The request id (from `trace list`), or its first characters.")
    ],
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
            request_id, _ = request_records(storage, request_id)
            try:
                report = replay(agent, request_id, storage)
            except HermesAgentError as exc:
                fail(str(exc))
    finally:
        agent.close()
    summary = report.summary()
    out().print(summary if verbose or not report.matched else summary.splitlines()[0])
    if not report.matched:
        step = next(s for s in report.steps if not s.matched)
        err().print(f"first difference at step {step.step}: {step.differences[0]}")
    raise typer.Exit(0 if report.matched else 1)


def _message_dict(message: Message) -> dict[str, Any]:
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


def _describe(message: Message) -> str:
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


# -- db ----------------------------------------------------------------------------------


def _database_urls(db: str | None, config: Path | None) -> list[str]:
    """``--db``, else the config's ``storage.url`` (default ``DEFAULT_STORAGE_URL``) and its
    ``service.keys_url`` when that is another database; never ``memory://``."""
    if db is not None:
        return [] if db.startswith("memory:") else [db]
    loaded = load_config(config) if config is not None else None
    urls = [loaded.storage.url if loaded and loaded.storage else DEFAULT_STORAGE_URL]
    keys_url = (loaded.service or {}).get("keys_url") if loaded is not None else None
    if isinstance(keys_url, str) and keys_url and keys_url not in urls:
        urls.append(keys_url)
    return [url for url in urls if not url.startswith("memory:")]


def _not_made_yet(url: str) -> bool:
    """A SQLite file that does not exist (``db version`` does not create it)."""
    from sqlalchemy.engine import make_url

    from hermes_agent.storage.engine import is_memory_url

    try:
        parsed = make_url(url)
    except Exception:
        return False  # make_engine says what is wrong with it
    database = parsed.database or ""
    return (
        parsed.get_backend_name() == "sqlite"
        and not is_memory_url(url)
        and not database.startswith("file:")
        and not Path(database).expanduser().exists()
    )


def _on_each_database(
    db: str | None, config: Path | None, apply: bool
) -> list[tuple[str, int | None, int]]:
    """(url, version before, version after) of each database the options name."""
    from sqlalchemy.exc import SQLAlchemyError

    from hermes_agent.storage.engine import make_engine, safe_url
    from hermes_agent.storage.schema import database_version, upgrade

    try:
        urls = _database_urls(db, config)
    except HermesAgentError as exc:
        fail(config_error(config, exc))
    if not urls:
        fail(
            "the storage is memory://, which keeps no schema (it lives in one process); "
            "pass --db with a SQLite or PostgreSQL URL"
        )
    found: list[tuple[str, int | None, int]] = []
    for url in urls:
        if not apply and _not_made_yet(url):
            found.append((safe_url(url), None, 0))
            continue
        try:
            engine = make_engine(url)
            try:
                before = database_version(engine)
                after = upgrade(engine) if apply else before
            finally:
                engine.dispose()
        except (HermesAgentError, SQLAlchemyError) as exc:
            fail(f"{safe_url(url)}: {exc}")
        found.append((safe_url(url), before, after))
    return found


@db_app.command("upgrade")
def db_upgrade(db: DbOption = None, config: ConfigOption = None) -> None:
    """Apply the schema's migrations (every table: sessions, audit, keys, quotas, stream tokens,
    channels, queued runs) to the storage's database and, when it is another one, the key
    store's; print the version reached. The stores do the same when they open, so this is for
    doing it ahead of a deployment. Safe to run while services use the database."""
    for url, before, after in _on_each_database(db, config, apply=True):
        change = f"(was {before})" if before != after else "(already up to date)"
        out().print(f"{url}: schema version {after} {change}", highlight=False)


@db_app.command("version")
def db_version(db: DbOption = None, config: ConfigOption = None) -> None:
    """Print the schema version of the database(s) ``db upgrade`` would upgrade, changing
    nothing (a SQLite file that does not exist is not created)."""
    from hermes_agent.storage.schema import LATEST_VERSION

    for url, before, _ in _on_each_database(db, config, apply=False):
        if before is None:
            note = "no database yet; `hermes-agent db upgrade` or any store creates it"
            out().print(f"{url}: schema version 0 of {LATEST_VERSION} ({note})", highlight=False)
            continue
        if before < LATEST_VERSION:
            note = "`hermes-agent db upgrade` applies the rest"
        elif before > LATEST_VERSION:
            note = "newer than this hermes-agent; upgrade hermes-agent-core"
        else:
            note = "up to date"
        out().print(f"{url}: schema version {before} of {LATEST_VERSION} ({note})", highlight=False)
