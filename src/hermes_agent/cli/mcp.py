"""``hermes-agent mcp serve``: the agent's tools (and, with ``--ask``, the agent itself) as an MCP
server, over stdio or streamable HTTP (the ``mcp`` extra).

    hermes-agent mcp serve --config config.yaml --tools tools.py            # stdio
    hermes-agent mcp serve --transport http --port 8001 --ask --approve delete_file

Over stdio, standard output carries the protocol and nothing else; notices go to standard error.
Calls are recorded in the audit trail of the config's storage (else ``.hermes/state.db``).
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
) -> None:
    """Serve the agent's tools over MCP (docs/mcp.md)."""
    if transport not in ("stdio", "http"):
        fail(f"--transport {transport!r}: use stdio or http")
    try:
        from hermes_agent.mcp.client import require_sdk

        require_sdk()
    except Exception as exc:
        fail(str(exc))
    from hermes_agent.mcp.server import AgentMcpServer, approve_only

    agent = cli_agent(config, tools, no_demo_tools)
    agent.approver = approve_only(approve or ())  # never the terminal: stdin may be the protocol
    try:
        server = AgentMcpServer(agent, ask=ask, toolsets=toolset, approve=approve or ())
    except ValueError as exc:
        agent.close()
        fail(str(exc))
    unknown = sorted(set(approve or ()) - set(server.tools()))
    if unknown:
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
            _serve_http(server, host, port, path)
    except (KeyboardInterrupt, _Terminated):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.close()
        agent.close()


def _serve_http(server: Any, host: str, port: int, path: str) -> None:
    try:
        import uvicorn
    except ImportError:
        fail('--transport http needs uvicorn: pip install "hermes-agent-core[mcp]"')
    app = server.http_app(host=host, path=path)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    uvicorn.Server(config).run()


class _Terminated(Exception):
    """SIGTERM arrived."""


def _terminate(_signum: int, _frame: object) -> None:
    raise _Terminated
