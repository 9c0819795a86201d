"""An MCP server (official SDK) that tries to make its client hold too much, for the bounds
tests: ``MISBEHAVE_TOOLS=N`` lists N extra tools; ``MISBEHAVE_LISTING_BYTES=N`` lists about N
bytes more of wide tools (a listing that is one huge, costly message); ``MISBEHAVE_SCHEMA_REF=URL``
lists a tool whose schema has a ``$ref`` to URL; ``MISBEHAVE_SCHEMA_PATTERN=REGEX`` lists a tool
``patterned`` whose argument ``s`` must match REGEX (``^(a+)+$`` backtracks for minutes in
Python's ``re``); ``huge`` answers a text
of the size asked; ``forever`` never answers, and keeps sending log notifications while it
does not.

    python mcp_misbehaving_server.py                  # stdio
    python mcp_misbehaving_server.py http PORT        # streamable HTTP, answers as events
    python mcp_misbehaving_server.py json PORT        # streamable HTTP, answers as JSON bodies
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import Tool as McpTool


def _padding(size: int) -> list[McpTool]:
    """Tools of about 2 kB each (twenty described parameters), ``size`` bytes of them: a
    listing as costly to parse as real schemas are."""
    schema = {
        "type": "object",
        "properties": {f"p{n}": {"type": "string", "description": "x" * 60} for n in range(20)},
    }
    return [
        McpTool(name=f"padded_{n}", description="d" * 200, input_schema=schema)
        for n in range(size // 2_000)
    ]


class _Padded(MCPServer):
    """Lists its tools, then the padding."""

    padding = _padding(int(os.environ.get("MISBEHAVE_LISTING_BYTES", "0")))

    async def list_tools(self) -> list[McpTool]:
        return [*await super().list_tools(), *self.padding]


server = _Padded("misbehaving")


@server.tool()
def huge(size: int) -> str:
    """A text of ``size`` characters."""
    return "x" * size


@server.tool()
async def forever(ctx: Context) -> str:
    """Never answers; talks all the while."""
    while True:
        await ctx.info("still working")
        await asyncio.sleep(0.05)  # a chatty server's pace: it talks and never answers


def _numbered(number: int) -> None:
    def tool(text: str) -> str:
        return f"{number}: {text}"

    server.add_tool(tool, name=f"tool_{number}", description=f"Tool number {number}.")


for _number in range(int(os.environ.get("MISBEHAVE_TOOLS", "0"))):
    _numbered(_number)

if os.environ.get("MISBEHAVE_SCHEMA_REF"):  # a tool whose schema names another document
    _elsewhere = {"$ref": os.environ["MISBEHAVE_SCHEMA_REF"]}
    _referenced = {"type": "object", "properties": {"x": _elsewhere}}
    _Padded.padding = [
        *_Padded.padding,
        McpTool(name="referenced", description="Refers elsewhere.", input_schema=_referenced),
    ]

if os.environ.get("MISBEHAVE_SCHEMA_PATTERN"):  # a tool whose argument has the server's pattern
    _text = {"type": "string", "pattern": os.environ["MISBEHAVE_SCHEMA_PATTERN"]}
    _patterned = {"type": "object", "properties": {"s": _text}, "required": ["s"]}
    _Padded.padding = [
        *_Padded.padding,
        McpTool(name="patterned", description="Takes a pattern.", input_schema=_patterned),
    ]


if __name__ == "__main__":
    if sys.argv[1:2] in (["http"], ["json"]):
        import uvicorn

        app = server.streamable_http_app(json_response=sys.argv[1] == "json")
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        server.run("stdio")
