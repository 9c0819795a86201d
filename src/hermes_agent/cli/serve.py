"""``hermes-agent serve``: the agent as an HTTP, SSE and WebSocket service (the ``server`` extra).

    hermes-agent serve                                  # embedded model + demo tools, loopback
    hermes-agent serve --config config.yaml --tools tools.py --port 8080

The service's settings are the config's ``service:`` section (``--host`` and ``--port``
override it); it listens on 127.0.0.1:8000 unless told otherwise. Keys and quota counts are
kept where ``hermes-agent keys`` puts them (``service.keys_url``, else ``storage.url``, else
``.hermes/state.db``), sessions and the audit trail in the config's storage (else
``.hermes/state.db``, as ``hermes-agent run`` does).

With no config, the demo tools are served and a key for the user ``local`` is made on the first
start and kept in ``.hermes/api-key`` (readable only by its owner), so that

    curl -s http://127.0.0.1:8000/v1/runs -H "Authorization: Bearer $(cat .hermes/api-key)" ...

works at once from the same folder. The key is never printed. ``Ctrl-C`` or ``SIGTERM`` stops
accepting, lets runs in flight finish for ``shutdown_grace_s``, cancels the rest and flushes the
audit trail.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hermes_agent.cli._common import (
    ConfigOption,
    ToolsOption,
    cli_agent,
    config_error,
    err,
    fail,
    require_server_extra,
    styled,
)
from hermes_agent.config import DEFAULT_STORAGE_URL, HermesConfig, load_config
from hermes_agent.errors import HermesAgentError
from hermes_agent.heap import settle_heap

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from hermes_agent.runs.keys import KeyStore
    from hermes_agent.runs.settings import ServiceSettings

LOCAL_KEY_FILE = Path(".hermes") / "api-key"
"""Where ``serve`` with no config keeps the key of the user ``local``."""
HEAD_GRACE_S = 0.5
"""Seconds a new connection may stay silent before it is the first to close when too many
are silent (a real client sends its request head within a round trip of connecting)."""
EXAMPLE_MESSAGE = '{"message": "What is 17 * 23?", "tool_choice": "required"}'


def serve(
    config: ConfigOption = None,
    tools: ToolsOption = None,
    host: Annotated[
        str | None,
        typer.Option("--host", help="Address to listen on (default: service.host, 127.0.0.1)."),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", "-p", min=0, max=65535, help="Port (default: service.port, 8000)."),
    ] = None,
    demo_tools: Annotated[
        bool | None,
        typer.Option(
            "--demo-tools/--no-demo-tools",
            help="Serve the built-in demo tools (default: only without --config).",
        ),
    ] = None,
    log_level: Annotated[
        str,
        typer.Option("--log-level", help="debug | info | warning | error (info: access log)."),
    ] = "info",
    warmup: Annotated[
        bool,
        typer.Option(
            "--warmup/--no-warmup",
            help="Load the model and evaluate the system prompt at start-up (/readyz is 503 "
            "until then); --no-warmup leaves it to the first request.",
        ),
    ] = True,
) -> None:
    """Serve the agent over HTTP, Server-Sent Events and WebSocket (docs/service.md). The
    embedded model is loaded at start-up, in the background: /readyz answers 200 once the
    first request will not wait for it."""
    require_server_extra("serve")
    import uvicorn

    from hermes_agent.cli.keys import key_store_url
    from hermes_agent.runs.settings import service_settings
    from hermes_agent.server import create_app, open_key_store

    level = log_level.lower()
    if level not in ("debug", "info", "warning", "error"):
        fail(f"--log-level {log_level!r}: use debug, info, warning or error")
    try:
        settings_file = load_config(config) if config else None
        settings = service_settings(settings_file, host=host, port=port)
        url = key_store_url(settings_file)
    except HermesAgentError as exc:
        fail(config_error(config, exc))
    if url.startswith("memory:") and settings.auth == "keys":
        where = f"{config}: " if config is not None else ""
        fail(
            f"{where}the key store is {url}: no key made by `hermes-agent keys` could reach "
            "it, so nobody could call the service; set service.keys_url (or storage.url) to a "
            "database, or auth: none on loopback"
        )
    settings = settings.model_copy(update={"keys_url": url})
    with_demo = config is None if demo_tools is None else demo_tools
    agent = cli_agent(config, tools, not with_demo, owned_loop=True)
    try:
        keys = open_key_store(url)
        key_file = local_key(keys) if settings_file is None and settings.auth == "keys" else None
        app = create_app(settings_file, agent=agent, settings=settings, keys=keys, warmup=warmup)
    except HermesAgentError as exc:
        agent.close()
        fail(config_error(config, exc))
    _setup_logging(level)
    _banner(settings.host, settings.port, settings_file, with_demo, key_file)
    # uvicorn shuts down gracefully on SIGINT and SIGTERM, then raises the signal again with
    # the handlers it found: these, so that the agent is closed and the exit status is 0.
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server_config = uvicorn_config(app, settings, level)
        settle_heap()  # all that the service keeps is built: the collector need not walk it
        drain = app.state.backends.drain
        _draining_server(uvicorn, drain, settings.shutdown_grace_s)(server_config).run()
    except _Stopped:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        agent.close()


def uvicorn_config(app: Any, settings: ServiceSettings, level: str = "info") -> Any:
    """The uvicorn configuration ``serve`` runs ``app`` with: no uvicorn access log (the
    service writes its own, without query strings, so no ``?access_token=`` key reaches a
    log), the WebSocket message limit of the body limit, and the connection limits of the
    settings — ``limit_concurrency``, ``timeout_keep_alive_s``, and ``header_timeout_s`` for
    clients that never finish a request's headers (uvicorn alone waits for them forever);
    see ``with_header_timeout`` for how silent connections are kept from those limits."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from hermes_agent.runs.keys import KeyRedaction

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=level,
        access_log=False,  # the service writes its own JSON access log
        ws_max_size=settings.max_body_bytes,  # a WebSocket message: the body limit too
        limit_concurrency=settings.limit_concurrency,
        timeout_keep_alive=settings.timeout_keep_alive_s,
        http=with_header_timeout(
            AutoHTTPProtocol, settings.header_timeout_s, settings.limit_concurrency
        ),
        # The runs' grace period starts at the signal (see _DrainingServer); uvicorn's
        # own wait for connections gets a few seconds more, to deliver the last events.
        timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 5,
    )
    # uvicorn set its logging up just now; at debug level its WebSocket library logs the
    # handshake's headers, the key a browser sends as a subprotocol among them.
    redaction = KeyRedaction()
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access", "hermes_agent.server"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, KeyRedaction) for f in handler.filters):
                handler.addFilter(redaction)
    return config


def with_header_timeout(
    protocol: type[Any], seconds: float, max_silent: int | None = None
) -> type[Any]:
    """uvicorn's HTTP protocol class with a deadline for each request's headers, and silent
    connections kept apart from the concurrency limit.

    Headers: a connection that has not sent a whole request head ``seconds`` after it opened
    (or after its last answer) is closed. Without it a client that sends one header byte now
    and then (slowloris), or nothing at all, holds its connection for ever. A connection
    upgraded to a WebSocket belongs to its own protocol (its pings) from then on.

    Silent connections — opened and no request head yet, or idle between keep-alive
    requests — do not count towards uvicorn's ``limit_concurrency`` (it counts every open
    connection, so anyone who opens that many and says nothing turns every other client's
    request into a 503, no key needed). Only connections with a request in progress (and
    WebSockets) count. Silent ones are bounded apart: at most ``max_silent`` are kept, and one
    more closes another — one silent for ``HEAD_GRACE_S`` if there is one (a new one that has
    sent nothing by then first, then an idle keep-alive one), else the oldest just opened. A
    real client sends its head within a round trip of connecting, and reuses a keep-alive
    connection at once or finds it closed, so a flood of silent connections closes its own."""
    fresh: dict[Any, float] = {}  # opened, nothing sent yet: since when (the oldest first)
    idle: dict[Any, float] = {}  # between keep-alive requests: since when (the oldest first)
    closing: dict[Any, float] = {}  # closed here, not yet gone (they still count as silent)

    def evict() -> None:
        now = time.monotonic()
        while max_silent is not None and len(fresh) + len(idle) > max_silent:
            for silent in (fresh, idle):
                oldest = next(iter(silent), None)
                if oldest is not None and now - silent[oldest] >= HEAD_GRACE_S:
                    break
            else:
                oldest = next(iter(fresh or idle))
            fresh.pop(oldest, None)
            idle.pop(oldest, None)
            closing[oldest] = now
            oldest.transport.close()

    class HeadTimeoutProtocol(protocol):  # type: ignore[misc]
        _head_timer: asyncio.TimerHandle | None = None
        connections: Any  # uvicorn's set, then the view of it its limit check reads

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.connections = _BusyConnections(self.connections, fresh, idle, closing)

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head_timer()
            fresh[self] = time.monotonic()
            evict()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._busy() or self.transport.get_protocol() is not self:  # head done, or upgraded
                fresh.pop(self, None)
                idle.pop(self, None)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()  # the next request's head has the same deadline
            if not self._busy():  # (a pipelined request may have started already)
                idle.pop(self, None)
                idle[self] = time.monotonic()  # the newest
                evict()

        def connection_lost(self, exc: Exception | None) -> None:
            for silent in (fresh, idle, closing):
                silent.pop(self, None)
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _busy(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def _arm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            loop = asyncio.get_running_loop()
            self._head_timer = loop.call_later(seconds, self._head_timed_out)

        def _head_timed_out(self) -> None:
            transport = self.transport
            if transport is None or transport.is_closing():
                return
            if transport.get_protocol() is not self:  # upgraded to a WebSocket
                return
            if self._busy():
                return  # a request whose head arrived is being answered
            transport.close()

    HeadTimeoutProtocol.__name__ = f"HeadTimeout{protocol.__name__}"
    return HeadTimeoutProtocol


class _BusyConnections:
    """uvicorn's set of open connections as its ``limit_concurrency`` check sees it: the
    silent ones left out. Adding and removing reach the server's own set (its shutdown
    still closes and waits for every connection)."""

    def __init__(self, connections: set[Any], *silent: dict[Any, float]) -> None:
        self._all = connections
        self._silent = silent

    def add(self, connection: Any) -> None:
        self._all.add(connection)

    def discard(self, connection: Any) -> None:
        self._all.discard(connection)

    def __len__(self) -> int:
        return max(len(self._all) - sum(map(len, self._silent)), 0)


def _draining_server(uvicorn: Any, drain: Callable[[float], Awaitable[None]], grace: float) -> Any:
    """A uvicorn server that starts draining runs the moment it is told to stop.

    Plain uvicorn first waits for open connections (clients following runs never close
    theirs) and only then runs the app's lifespan shutdown, which grants the runs a grace
    period of their own: twice the grace in all, and followers dropped without their run's
    end. Starting ``Backends.drain`` with uvicorn's shutdown makes it one grace period,
    after which followers receive ``run_stopped`` and close."""

    class DrainingServer(uvicorn.Server):  # type: ignore[misc]
        async def shutdown(self, sockets: Any = None) -> None:
            draining = asyncio.ensure_future(drain(grace))
            await super().shutdown(sockets)
            await draining

    return DrainingServer


class _Stopped(Exception):
    """A signal asked the service to stop (after uvicorn's graceful shutdown)."""


def _stop(signum: int, _frame: object) -> None:
    raise _Stopped(signum)


def local_key(keys: KeyStore) -> Path:
    """The key file of the user ``local`` for ``serve`` with no config: the key it holds when
    the store still knows it, else a new key written there (mode 0600)."""
    from hermes_agent.runs.principal import LOCAL_USER

    if LOCAL_KEY_FILE.is_file():
        principal = keys.lookup(LOCAL_KEY_FILE.read_text(encoding="utf-8").strip())
        if principal is not None and principal.user_id == LOCAL_USER:
            return LOCAL_KEY_FILE
    key = keys.create(LOCAL_USER, name="hermes-agent serve (no config)")
    LOCAL_KEY_FILE.parent.mkdir(parents=True, exist_ok=True)
    LOCAL_KEY_FILE.unlink(missing_ok=True)
    descriptor = os.open(LOCAL_KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(key + "\n")
    return LOCAL_KEY_FILE


def _setup_logging(level: str) -> None:
    # The access log is one JSON object per line; the service's own notices (a warning for
    # auth: none, a run that failed) go beside it.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("hermes_agent.server")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def _banner(
    host: str, port: int, config: HermesConfig | None, demo: bool, key_file: Path | None
) -> None:
    base = f"http://{host}:{port}"
    what = config.source if config is not None else "the embedded model (no config)"
    tools = ", with the demo tools" if demo else ""
    err().print(styled("Serving ", (what, "bold"), f"{tools} on {base}"))
    if key_file is not None:
        err().print(
            f"The API key of the user 'local' is in {key_file}. Try, from this folder:\n"
            f'  curl -s {base}/v1/runs -H "Authorization: Bearer $(cat {key_file})" '
            f"-H \"Content-Type: application/json\" -d '{EXAMPLE_MESSAGE}'"
        )
    if config is None:
        err().print(f"Sessions, the audit trail and the key are kept in {DEFAULT_STORAGE_URL}.")
