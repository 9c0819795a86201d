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
import json
import signal
from typing import TYPE_CHECKING, Annotated, Any

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

if TYPE_CHECKING:
    from hermes_agent.backends import Backends

mcp_app = typer.Typer(
    name="mcp",
    help="Model Context Protocol: serve the agent's tools to MCP clients; approve the "
    "tool definitions of the MCP servers the agent uses.",
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
    served = _backend_for(config, agent, http_keys=transport == "http" and auth == "keys")
    try:
        server = AgentMcpServer(
            served.agent,
            ask=ask,
            toolsets=toolset,
            approve=approve or (),
            keys=served.keys,
            local_user=local,
            backend=served.backend,
        )
    except ValueError as exc:
        served.close()
        agent.close()
        fail(str(exc))
    unknown = sorted(set(approve or ()) - set(server.tools()))
    if unknown:
        server.close()
        served.close()
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
            _serve_http(server, host, port, path, served.settings)
    except (KeyboardInterrupt, _Terminated):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
        served.close()  # the queue's connections, the serving fork and the keys
        agent.close()


@mcp_app.command("approve-tools")
def approve_tools(
    server: Annotated[str, typer.Argument(help="The server (a key of mcp_servers).")],
    config: ConfigOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Approve without asking.")] = False,
) -> None:
    """Review and approve the tool definitions an MCP server lists now (docs/mcp-security.md).

    A tool whose name, description or input schema changed since it was approved is refused
    until this command approves it again.
    """
    from hermes_agent.config import load_config
    from hermes_agent.tools.mcp.client import McpToolsets, require_sdk
    from hermes_agent.tools.mcp.oauth import OAuthSignIn, default_oauth_folder
    from hermes_agent.tools.mcp.pins import PinStore, default_pins_path

    try:
        require_sdk()
        settings = load_config(config) if config else None
    except Exception as exc:
        fail(str(exc))
    if settings is None or server not in settings.mcp_servers:
        fail(f"no MCP server {server!r} in the config's mcp_servers")
    path = settings.mcp_pins or default_pins_path(settings.source)
    if path is None:
        fail("the config came from no file: give it mcp_pins (where approvals are kept)")
    pins = PinStore(path)
    sign_in = OAuthSignIn(default_oauth_folder(settings.source))  # the agent's OAuth tokens
    toolsets = McpToolsets({server: settings.mcp_servers[server]}, sign_in=sign_in)
    connection = toolsets.connections[server]
    try:
        listing = toolsets.run(connection.list_tools(), connection.config.connect_budget + 15)
    except Exception as exc:
        fail(f"MCP server {server!r}: {exc}")
    finally:
        toolsets.close()
    pinned = pins.pins().get(server, {})
    changed = [t for t in listing if pinned.get(t.name) != connection.definitions[t.name]]
    if not changed:
        err().print(f"Every tool of {server!r} is approved as it is listed now.")
        return
    for tool in changed:
        state = "new" if tool.name not in pinned else "changed"
        err().print(styled((f"{tool.name} ({state})", "bold")))
        err().print(f"  description: {tool.description or ''}", markup=False)
        schema = json.dumps(tool.input_schema, sort_keys=True)
        err().print(f"  input schema: {schema}", markup=False)
    if not yes and not typer.confirm(f"Approve these {len(changed)} tool definitions?"):
        fail("nothing approved")
    pins.approve(server, {t.name: connection.definitions[t.name] for t in changed})
    err().print(f"Approved {len(changed)} tool definitions of {server!r} in {path}")


def _backend_for(config: Any, agent: Any, *, http_keys: bool) -> Backends:
    """What serves the calls of ``agent``, built by the one composition root
    (``backends.build_backend``) as ``hermes-agent serve`` builds it: the service's limits and
    daily quotas (the config's ``service:`` section), its API keys over HTTP with keys (where
    ``hermes-agent keys`` puts them), and, with ``execution: queue``, the queue its ``ask``
    runs go to."""
    from hermes_agent.backends import build_backend
    from hermes_agent.config import load_config
    from hermes_agent.runs.settings import service_settings

    try:
        loaded = load_config(config) if config else None
        return build_backend(agent, service_settings(loaded), config=loaded, with_keys=http_keys)
    except Exception as exc:
        agent.close()
        fail(str(exc))


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
    from hermes_agent.runs.settings import McpDoor

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
