"""``hermes-agent channels``: the operator's view of the channels' dead letters and log.

    hermes-agent channels dead-letters --config config.yaml      # what was not delivered
    hermes-agent channels resend 3f2a --config config.yaml       # one, by id or first characters
    hermes-agent channels resend --all --config config.yaml      # every pending one, oldest first
    hermes-agent channels log --config config.yaml               # inbound and delivery events

The store is the one ``hermes-agent serve`` with the same options keeps them in (beside the API
keys): ``--db URL``, else ``service.keys_url``, else ``storage.url``, else
``sqlite:///.hermes/state.db``. A resend uses the channels of the config (their URLs, secrets and
SMTP settings) and delivers the parts exactly as they were rendered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from hermes_agent.cli._common import (
    ConfigOption,
    config_error,
    fail,
    out,
    require_server_extra,
    resolve_id,
)
from hermes_agent.cli.keys import KeysDbOption, key_store_url
from hermes_agent.config import load_config
from hermes_agent.errors import HermesAgentError

if TYPE_CHECKING:
    from hermes_agent.channels.config import ChannelSettings
    from hermes_agent.channels.store import ChannelStore

channels_app = typer.Typer(
    name="channels",
    help="List and resend the channels' dead letters; show the channel log.",
    no_args_is_help=True,
)

ChannelOption = Annotated[
    str | None, typer.Option("--channel", help="Only this channel's entries.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@contextmanager
def opened(
    db: str | None, config: Path | None
) -> Iterator[tuple[ChannelStore, dict[str, ChannelSettings]]]:
    """The channel store and the channels the options name (exit 2 when they cannot be
    opened)."""
    require_server_extra("channels")
    from hermes_agent.channels.config import channel_settings
    from hermes_agent.channels.store import open_channel_store
    from hermes_agent.runs.settings import service_settings

    try:
        loaded = load_config(config) if config else None
        settings = service_settings(loaded)
        channels = channel_settings(
            settings.channels, source=loaded.source if loaded else "<settings>"
        )
        url = key_store_url(loaded, db)
        if url.startswith("memory:"):
            fail(
                f"the channel store is {url}, which lives only inside a server process; set "
                "service.keys_url (or storage.url) to a database, or pass --db"
            )
        store = open_channel_store(url)
    except HermesAgentError as exc:
        fail(config_error(config, exc))
    try:
        yield store, channels
    finally:
        store.close()


def _when(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


@channels_app.command("dead-letters")
def dead_letters(
    channel: ChannelOption = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="Also those a resend has delivered.")
    ] = False,
    db: KeysDbOption = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Messages not delivered after their last retry, oldest first: id, channel, user, request,
    attempts, the last error."""
    with opened(db, config) as (store, _):
        found = store.dead_letters(status=None if show_all else "pending", channel=channel)
    if as_json:
        out().print_json(json.dumps([letter.to_dict() for letter in found], ensure_ascii=False))
        return
    table = Table(title=f"dead letters ({len(found)})")
    table.add_column("id", no_wrap=True)
    for column in ("channel", "kind", "user", "request", "created", "attempts", "status", "error"):
        table.add_column(column)
    for letter in found:
        table.add_row(
            letter.id,
            letter.channel,
            letter.kind,
            letter.user_id or "",
            letter.request_id or "",
            _when(letter.created),
            str(letter.attempts),
            letter.status,
            letter.error,
        )
    out().print(table)


@channels_app.command("resend")
def resend(
    letter_id: Annotated[
        str | None, typer.Argument(help="A dead letter's id (or its first characters).")
    ] = None,
    resend_all: Annotated[
        bool, typer.Option("--all", help="Every pending dead letter (of --channel, if given).")
    ] = False,
    channel: ChannelOption = None,
    db: KeysDbOption = None,
    config: ConfigOption = None,
) -> None:
    """Deliver dead letters again through their channel (with its retries). Exit 1 when one
    still fails (it stays a dead letter, with the new error)."""
    if (letter_id is None) == (not resend_all):
        fail("give a dead letter's id, or --all")
    from hermes_agent.channels.hub import ChannelHub

    with opened(db, config) as (store, channels):
        pending = store.dead_letters(status="pending", channel=channel)
        if letter_id is not None:
            everything = store.dead_letters(status=None, channel=channel)
            ids = [letter.id for letter in everything]
            whole = resolve_id(
                letter_id,
                lambda prefix, limit: [i for i in ids if i.startswith(prefix)][:limit],
                what="dead letter",
                missing=f"no dead letter {letter_id!r}; see `hermes-agent channels dead-letters`",
            )
            pending = [letter for letter in everything if letter.id == whole]
        unknown = sorted({letter.channel for letter in pending} - set(channels))
        if unknown:
            fail(
                f"the config has no channel {', '.join(map(repr, unknown))}; resend needs the "
                "config the service runs with (--config)"
            )
        hub = ChannelHub(channels, store=store)

        async def send_all() -> list[tuple[str, bool, str | None]]:
            done = []
            try:
                for letter in pending:
                    result = await hub.resend(letter.id)
                    done.append((letter.id, result.delivered, result.error))
            finally:
                await hub.aclose()
            return done

        outcomes = asyncio.run(send_all())
    failed = 0
    for letter_id_done, ok, error in outcomes:
        if ok:
            out().print(f"delivered {letter_id_done}")
        else:
            failed += 1
            out().print(f"not delivered {letter_id_done}: {error}")
    if not outcomes:
        out().print("no pending dead letters")
    if failed:
        raise typer.Exit(1)


@channels_app.command("log")
def log(
    channel: ChannelOption = None,
    event: Annotated[
        str | None,
        typer.Option(
            "--event", help="Only this event (accepted, quota_rejected, dead_lettered, ...)."
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 50,
    db: KeysDbOption = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """The channel log, newest first: inbound messages accepted or refused (with the user id
    used), deliveries, dead letters, resends."""
    with opened(db, config) as (store, _):
        found = store.entries(channel=channel, event=event, limit=limit)
    if as_json:
        rows = [
            {
                "time": e.time,
                "channel": e.channel,
                "event": e.event,
                "user_id": e.user_id,
                "request_id": e.request_id,
                "detail": e.detail,
            }
            for e in found
        ]
        out().print_json(json.dumps(rows, ensure_ascii=False))
        return
    table = Table(title=f"channel log ({len(found)})")
    for column in ("time", "channel", "event", "user", "request", "detail"):
        table.add_column(column)
    for e in found:
        table.add_row(
            _when(e.time), e.channel, e.event, e.user_id or "", e.request_id or "", e.detail
        )
    out().print(table)
