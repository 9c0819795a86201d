"""``hermes-agent worker`` and ``hermes-agent runs``: queued runs on Celery workers (the
``worker`` extra; docs/scale-out.md).

    hermes-agent worker --config config.yaml --tools tools.py          # 4 runs at a time
    hermes-agent worker --config config.yaml --concurrency 16
    hermes-agent runs list --config config.yaml --status dead          # the dead letters
    hermes-agent runs requeue RUN_ID --config config.yaml              # put one back

The config's ``queue:`` section names the broker; its ``storage.url`` is where the runs' state
lives (PostgreSQL when workers run on several machines).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from hermes_agent.cli._common import (
    ConfigOption,
    ToolsOption,
    config_error,
    fail,
    out,
    setup_logging,
)
from hermes_agent.config import HermesConfig, load_config
from hermes_agent.errors import HermesAgentError

HTTP_CLIENT_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")
"""Loggers of the HTTP clients a worker's model calls go through, kept at WARNING (the openai
SDK's own, which says when it retries a request, is left as it is)."""

runs_app = typer.Typer(
    name="runs",
    help="Queued runs: list them, put a dead or failed one back.",
    no_args_is_help=True,
)


def _config(config: Path | None) -> HermesConfig:
    if config is None:
        fail("queued runs need --config with a queue: section and storage.url")
    try:
        settings = load_config(config)
    except HermesAgentError as exc:
        fail(config_error(config, exc))
    if settings.queue is None:
        fail(f"{config}: add a queue: section (broker: redis://127.0.0.1:6379/0) to run workers")
    if settings.storage is None:
        fail(f"{config}: add storage.url (the store the runs' state lives in)")
    return settings


def worker(
    config: ConfigOption = None,
    tools: ToolsOption = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="Runs this worker takes at a time.")
    ] = 4,
    pool: Annotated[
        str, typer.Option("--pool", help="Celery pool: threads (default), prefork or solo.")
    ] = "threads",
    name: Annotated[str | None, typer.Option("--name", help="Celery node name.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Log each pipeline stage.")] = False,
) -> None:
    """Start a worker that runs queued runs (Ctrl-C stops it; runs it held are taken over)."""
    settings = _config(config)
    setup_logging(debug)
    if not debug:  # the worker's own lines (claims, takeovers), not every pipeline stage
        logging.getLogger("hermes_agent").setLevel(logging.WARNING)
        logging.getLogger("hermes_agent.worker").setLevel(logging.INFO)
        # Nor a line per model request: Celery's INFO level reaches the HTTP clients' loggers,
        # which write one for each request (two or more a run, a formatted line each).
        for client_logger in HTTP_CLIENT_LOGGERS:
            logging.getLogger(client_logger).setLevel(logging.WARNING)
    try:
        from hermes_agent.worker.app import run_worker

        run_worker(
            settings,
            [str(path) for path in tools or []],
            concurrency=concurrency,
            pool=pool,
            hostname=name,
            loglevel="DEBUG" if debug else "INFO",
        )
    except HermesAgentError as exc:
        fail(str(exc))


def _store(config: Path | None):  # type: ignore[no-untyped-def]
    from hermes_agent.storage.sql import SqlStorage
    from hermes_agent.worker.store import RunStore

    settings = _config(config)
    assert settings.storage is not None and settings.queue is not None
    try:
        return settings, RunStore(
            SqlStorage(settings.storage.url), max_redeliveries=settings.queue.max_redeliveries
        )
    except HermesAgentError as exc:
        fail(str(exc))


@runs_app.command("list")
def list_runs(
    config: ConfigOption = None,
    status: Annotated[
        str | None, typer.Option("--status", help="Only runs in this status.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines.")] = False,
) -> None:
    """Queued runs of every user, newest first (``--json``: one run per line, in the shape
    ``GET /v1/runs/{id}`` answers, with its ``owner``)."""
    _, store = _store(config)
    found = store.runs(status=status, limit=limit)
    if as_json:  # the one run shape (GET /v1/runs/{id}), with whose run it is
        for run in found:
            shown = {**run.view().to_dict(), "owner": run.owner}
            out().print(json.dumps(shown, ensure_ascii=False), soft_wrap=True)
        return
    table = Table("request id", "session", "status", "claims", "redeliveries", "error")
    for run in found:
        table.add_row(
            run.request_id,
            run.session_id,
            run.status,
            str(run.claims),
            str(run.redeliveries),
            run.error or "",
        )
    out().print(table)


@runs_app.command("requeue")
def requeue(
    request_id: Annotated[str, typer.Argument(help="The run's request id.")],
    config: ConfigOption = None,
) -> None:
    """Put a dead, failed or cancelled run back in the queue: it resumes from its journal."""
    settings, store = _store(config)
    assert settings.queue is not None
    try:
        run = store.requeue(request_id)
        from hermes_agent.worker.app import enqueue, make_celery

        enqueue(make_celery(settings.queue), settings.queue, request_id)
    except HermesAgentError as exc:
        fail(str(exc))
    out().print(f"requeued {run.request_id} (session {run.session_id})", soft_wrap=True)
