"""``hermes-agent keys``: the service's API keys (the ``server`` extra).

    hermes-agent keys create --user alice              # prints the key: the only time it is shown
    hermes-agent keys create --user ops --admin --name "on-call dashboard"
    hermes-agent keys list                             # ids, users, names; never the keys
    hermes-agent keys revoke KEY_ID                    # the key stops working at once

Keys go where ``hermes-agent serve`` with the same options reads them: ``--db URL``, else the
config's ``service.keys_url``, else its ``storage.url``, else ``sqlite:///.hermes/state.db``.
The store keeps each key's SHA-256, never the key; a key is bound to a stable user id, which is
what the user's runs, sessions, approvals and daily quotas belong to.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from hermes_agent.cli._common import (
    ConfigOption,
    config_error,
    err,
    fail,
    out,
    require_server_extra,
    resolve_id,
    styled,
)
from hermes_agent.config import DEFAULT_STORAGE_URL, HermesConfig, load_config
from hermes_agent.errors import HermesAgentError

if TYPE_CHECKING:
    from hermes_agent.runs.keys import KeyStore

KeysDbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL of the key store (default: the config's service.keys_url, else its "
        f"storage.url, else {DEFAULT_STORAGE_URL}).",
    ),
]

keys_app = typer.Typer(
    name="keys",
    help="Create, list and revoke the service's API keys.",
    no_args_is_help=True,
)


def key_store_url(config: HermesConfig | None, db: str | None = None) -> str:
    """The key store ``hermes-agent serve`` and ``keys`` use for these options. Raises
    ``ConfigError`` for a bad ``service:`` section."""
    from hermes_agent.runs.settings import service_settings, store_url

    if db is not None:
        return db
    return store_url(service_settings(config), config, DEFAULT_STORAGE_URL)


@contextmanager
def opened_keys(db: str | None, config: Path | None) -> Iterator[KeyStore]:
    """The key store the options name; a usage error (exit 2) when it cannot be opened."""
    require_server_extra("keys")
    from hermes_agent.runs.keys import open_key_store

    try:
        url = key_store_url(load_config(config) if config else None, db)
        if url.startswith("memory:"):
            fail(
                f"the key store is {url}, which lives only inside a server process, where this "
                "command cannot reach it; set service.keys_url (or storage.url) to a database, "
                "or pass --db"
            )
        keys = open_key_store(url)
    except HermesAgentError as exc:
        fail(config_error(config, exc))
    try:
        yield keys
    finally:
        keys.close()


@keys_app.command("create")
def keys_create(
    user: Annotated[
        str,
        typer.Option("--user", "-u", help="The stable user id the key stands for (e.g. alice)."),
    ],
    admin: Annotated[
        bool, typer.Option("--admin", help="An operator's key: sees every user's runs.")
    ] = False,
    name: Annotated[
        str | None, typer.Option("--name", help="What the key is for (shown by `keys list`).")
    ] = None,
    db: KeysDbOption = None,
    config: ConfigOption = None,
) -> None:
    """Create a key and print it (on standard output, alone, so that KEY=$(...) takes it).
    This is the only time the key is shown: the store keeps only its hash."""
    with opened_keys(db, config) as keys:
        try:
            key = keys.create(user, admin=admin, name=name)
        except ValueError as exc:
            fail(str(exc))
    key_id = key[3:].split(".", 1)[0]
    kind = "an admin key" if admin else "a key"
    err().print(
        styled(
            f"created {kind} for user {user!r} (id {key_id}); ",
            ("it is shown only now: keep it secret", "bold"),
        )
    )
    out().print(key)


@keys_app.command("list")
def keys_list(
    db: KeysDbOption = None,
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Every key, oldest first: its id, user, kind, name, when it was made, whether it is
    revoked. The keys themselves are never stored, so never shown."""
    with opened_keys(db, config) as keys:
        found = keys.list()
    if as_json:
        out().print_json(json.dumps([asdict(info) for info in found], ensure_ascii=False))
        return
    table = Table(title=f"API keys ({len(found)})")
    table.add_column("key id", no_wrap=True)
    for column in ("user", "kind", "name", "created", "status"):
        table.add_column(column)
    for info in found:
        table.add_row(
            info.key_id,
            info.user_id,
            "admin" if info.admin else "user",
            info.name or "",
            info.created,
            "revoked" if info.revoked else "active",
        )
    out().print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[
        str, typer.Argument(help="The key's id (from `keys list`), or its first characters.")
    ],
    db: KeysDbOption = None,
    config: ConfigOption = None,
) -> None:
    """Revoke a key: every request that presents it is refused (401) from now on."""
    with opened_keys(db, config) as keys:
        found = {info.key_id: info for info in keys.list()}
        whole = resolve_id(
            key_id,
            lambda prefix, limit: [k for k in found if k.startswith(prefix)][:limit],
            what="key",
            missing=f"no key {key_id!r} (an id or its first characters); see `hermes-agent keys "
            "list`",
        )
        info = found[whole]
        if info.revoked:
            out().print(f"key {whole} (user {info.user_id}) was revoked already")
            return
        keys.revoke(whole)
    out().print(f"revoked key {whole} (user {info.user_id})")
