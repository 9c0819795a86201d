"""An MCP server (official SDK, stdio) that tries to make its client hold too much, for the
bounds tests: ``MISBEHAVE_TOOLS=N`` lists N extra tools; ``huge`` answers a text of the size
asked; ``forever`` never answers, and keeps sending log notifications while it does not.

    python mcp_misbehaving_server.py
"""

from __future__ import annotations

import asyncio
import os

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("misbehaving")


@server.tool()
def huge(size: int) -> str:
    """A text of ``size`` characters."""
    return "x" * size


@server.tool()
async def forever(ctx: Context) -> str:
    """Never answers; talks all the while."""
    while True:
        await ctx.info("still working")
        await asyncio.sleep(0.05)


def _numbered(number: int) -> None:
    def tool(text: str) -> str:
        return f"{number}: {text}"

    server.add_tool(tool, name=f"tool_{number}", description=f"Tool number {number}.")


for _number in range(int(os.environ.get("MISBEHAVE_TOOLS", "0"))):
    _numbered(_number)


if __name__ == "__main__":
    server.run("stdio")
