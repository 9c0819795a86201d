"""``hermes-agent mcp serve``: the agent's tools (and, with ``--ask``, the agent itself) as an MCP
server, over stdio or streamable HTTP (the ``mcp`` extra).

    hermes-agent mcp serve --config config.yaml --tools tools.py            # stdio
    hermes-agent mcp serve --transport http --port 8001 --ask --approve delete_file

Over stdio, standard output carries the protocol and nothing else; notices go to standard error.
Calls are recorded in the audit trail of the config's storage (else ``.hermes/state.db``).

Over HTTP, callers present the service's API keys (``--auth keys``, the default: the keys of
``hermes-agent keys create``) and run as those keys' users, under the service's limits and
quotas; ``--auth none`` runs every call as the local MCP user and is allowed on loopback only.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated, Any

import typer

from hermes_agent.cli._common import (
    ConfigOption,
    NoDemoOption,
    ToolsOption,
    cli_agent,
    err,
    fail,
    styled,
)

mcp_app = typer.Typer(
    name="mcp",
    help="Model Context Protocol: serve the agent's tools to MCP clients.",
    no_args_is_help=True,
)


@mcp_app.command("serve")
def serve(
    config: ConfigOption = None,
    tools: ToolsOption = None,
    no_demo_tools: NoDemoOption = False,
    transport: Annotated[
        str, typer.Option("--transport", help="stdio (default) or http (streamable HTTP).")
    ] = "stdio",
    host: Annotated[str, typer.Option("--host", help="http: address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535, help="http: port.")] = 8001,
    path: Annotated[str, typer.Option("--path", help="http: the endpoint's path.")] = "/mcp",
    ask: Annotated[
        bool, typer.Option("--ask", help="Also serve the agent itself as the tool 'ask'.")
    ] = False,
    approve: Annotated[
        list[str] | None,
        typer.Option(
            "--approve",
            help="Approve every call of this tool (repeatable); other tools that need "
            "approval are denied.",
        ),
    ] = None,
    toolset: Annotated[
        list[str] | None,
        typer.Option("--toolset", help="Serve only the tools of this toolset (repeatable)."),
    ] = None,
    auth: Annotated[
        str,
        typer.Option(
            "--auth",
            help="http: keys (callers send the service's API keys; the default) or none "
            "(loopback only: every call runs as the local MCP user).",
        ),
    ] = "keys",
    user: Annotated[
        str,
        typer.Option(
            "--user",
            help="The local MCP user calls run as without keys (stdio, --auth none): its "
            "sessions are mcp!NAME's own.",
        ),
    ] = "local",
) -> None:
    """Serve the agent's tools over MCP (docs/mcp.md)."""
    if transport not in ("stdio", "http"):
        fail(f"--transport {transport!r}: use stdio or http")
    if auth not in ("keys", "none"):
        fail(f"--auth {auth!r}: use keys or none")
    from hermes_agent.runs.principal import is_loopback, mcp_local_user

    if transport == "http" and auth == "none" and not is_loopback(host):
        fail(
            f"--host {host} with --auth none would let anyone on the network run the agent's "
            "tools; use --auth keys (the service's API keys) or listen on 127.0.0.1"
        )
    try:
        local = mcp_local_user(user)
    except ValueError as exc:
        fail(f"--user: {exc}")
    try:
        from hermes_agent.tools.mcp.client import require_sdk

        require_sdk()
    except Exception as exc:
        fail(str(exc))
    from hermes_agent.mcp.server import AgentMcpServer, approve_only

    agent = cli_agent(config, tools, no_demo_tools)
    agent.approver = approve_only(approve or ())  # never the terminal: stdin may be the protocol
    keys, engine, queue = _engine_for(
        config, agent, http_keys=transport == "http" and auth == "keys"
    )
    try:
        server = AgentMcpServer(
            engine.agent,
            ask=ask,
            toolsets=toolset,
            approve=approve or (),
            keys=keys,
            local_user=local,
            backend=queue if queue is not None else engine.backend,
        )
    except ValueError as exc:
        engine.close()
        agent.close()
        fail(str(exc))
    unknown = sorted(set(approve or ()) - set(server.tools()))
    if unknown:
        server.close()
        engine.close()
        agent.close()
        fail(f"--approve {', '.join(unknown)}: no such tool is served")
    names = [*server.tools(), *(["ask"] if ask else [])]
    where = f"http://{host}:{port}{path}" if transport == "http" else "stdio"
    err().print(
        styled("Serving ", (", ".join(names) or "no tools", "bold"), f" over MCP on {where}")
    )
    # SIGTERM ends the process through the finally below, so the servers this agent started
    # (its own mcp_servers) are stopped too.
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        if transport == "stdio":
            asyncio.run(server.run_stdio())
        else:
            _serve_http(server, host, port, path, engine.manager.settings)
    except (KeyboardInterrupt, _Terminated):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
        if queue is not None:
            queue.close()
        engine.close()
        agent.close()
        if keys is not None:
            keys.close()


def _engine_for(config: Any, agent: Any, *, http_keys: bool) -> tuple[Any, Any, Any]:
    """The service's key store (over HTTP with keys), the in-process engine for ``agent``
    with the service's limits and daily quotas (as ``hermes-agent serve`` applies them), and,
    with ``execution: queue``, the queue its ``ask`` runs go to instead."""
    from hermes_agent.cli.keys import key_store_url
    from hermes_agent.config import load_config
    from hermes_agent.server.auth import MemoryKeyStore, open_key_store
    from hermes_agent.server.in_process import serve_in_process
    from hermes_agent.server.queued import QueueService
    from hermes_agent.server.quotas import Quotas, quota_store_for
    from hermes_agent.server.settings import service_settings

    try:
        loaded = load_config(config) if config else None
        settings = service_settings(loaded)
        keys = open_key_store(key_store_url(loaded)) if http_keys else None
    except Exception as exc:
        fail(str(exc))
    quota_keys = keys if keys is not None else MemoryKeyStore()
    quotas = Quotas(settings.quotas, quota_store_for(quota_keys))
    engine = serve_in_process(agent, settings, quotas=quotas)
    queue = None
    if settings.execution == "queue":
        assert loaded is not None and engine.agent.storage is not None
        try:
            queue = QueueService(loaded, engine.agent.storage, settings, engine.manager)
        except Exception as exc:
            engine.close()
            fail(str(exc))
    return keys, engine, queue


def _serve_http(server: Any, host: str, port: int, path: str, settings: Any) -> None:
    """Serve ``server`` over streamable HTTP with the connection limits ``hermes-agent serve``
    applies (the config's ``service:`` section) and the MCP session limits of its
    ``service.mcp`` (the defaults without one)."""
    try:
        import uvicorn
    except ImportError:
        fail('--transport http needs uvicorn: pip install "hermes-agent-core[mcp]"')
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from hermes_agent.cli.serve import with_header_timeout
    from hermes_agent.server.settings import McpDoor

    door = settings.mcp or McpDoor()
    app = server.http_app(
        host=host,
        path=path,
        max_sessions_per_user=door.max_sessions_per_user,
        session_idle_timeout_s=door.session_idle_timeout_s,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        limit_concurrency=settings.limit_concurrency,
        timeout_keep_alive=settings.timeout_keep_alive_s,
        http=with_header_timeout(
            AutoHTTPProtocol, settings.header_timeout_s, settings.limit_concurrency
        ),
    )
    uvicorn.Server(config).run()


class _Terminated(Exception):
    """SIGTERM arrived."""


def _terminate(_signum: int, _frame: object) -> None:
    raise _Terminated
