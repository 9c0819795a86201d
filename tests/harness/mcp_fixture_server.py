"""An MCP server written with the official SDK, for the MCP client tests (a real subprocess).

    python mcp_fixture_server.py stdio
    python mcp_fixture_server.py http PORT

Every call that reaches a tool appends one line ``<pid> <tool> <arguments>`` to the file named
by ``FIXTURE_CALLS`` (when set), so a test can tell which calls reached the server, and which
process served them. ``slow`` writes its line first and then sleeps, so a test can kill the
process in the middle of a call.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import MCPServer
from pydantic import Field

server = MCPServer("fixture", instructions="Arithmetic and friends, for tests.")


def _count(tool: str, arguments: dict[str, Any]) -> None:
    path = os.environ.get("FIXTURE_CALLS")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(f"{os.getpid()} {tool} {json.dumps(arguments, sort_keys=True)}\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    _count("add", {"a": a, "b": b})
    return a + b


@server.tool()
def echo(text: str, times: int = 1) -> str:
    """Repeat a text."""
    _count("echo", {"text": text, "times": times})
    return " ".join([text] * times)


@server.tool()
def forecast(city: str, days: int = Field(default=1, ge=1, le=7)) -> dict[str, Any]:
    """A made-up weather forecast."""
    _count("forecast", {"city": city, "days": days})
    return {"city": city, "days": [{"day": n + 1, "sky": "clear"} for n in range(days)]}


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer (the call is counted before the sleep)."""
    _count("slow", {"seconds": seconds})
    time.sleep(seconds)  # slow work on purpose: a call to time out or to kill
    return f"slept {seconds:g} s"


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the reason."""
    _count("fail", {"reason": reason})
    raise ValueError(reason)


@server.tool()
def delete_everything(confirm: bool) -> str:
    """A tool nobody should run unasked."""
    _count("delete_everything", {"confirm": confirm})
    return "deleted"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
