"""What an MCP server's answers become: a call's result as the JSON data a Python tool would
return (``tool_result``), bounded in size (``bounded_result``), and its failures as one short
line (``describe``) in an ``McpError``."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from hermes_agent.errors import HermesAgentError

if TYPE_CHECKING:
    from mcp.types import CallToolResult, ContentBlock

_MAX_MESSAGE = 600


class McpError(HermesAgentError):
    """A call to an MCP server failed: the server reported an error, could not be reached, or
    the connection was lost. Inside a run it becomes the call's error result (status 500)."""


def tool_result(result: CallToolResult) -> Any:
    """A ``CallToolResult`` as the value a Python tool would return: its structured content
    when it has some; else its one block (a text holding a JSON object or array parsed: the
    model then reads the data, not an escaped string), or the list of its blocks; ``McpError``
    with the server's text when it is an error result."""
    if result.is_error:
        text = "; ".join(str(block) for block in map(_block, result.content)) or "no details"
        raise McpError(bounded(text))
    if result.structured_content is not None:
        return result.structured_content
    blocks = [_block(block) for block in result.content]
    if len(blocks) != 1:
        return blocks
    only = blocks[0]
    if isinstance(only, str) and only.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(only)
        except ValueError:
            pass
    return only


def bounded_result(value: Any, limit: int, server: str) -> Any:
    """``value`` when its JSON is at most ``limit`` bytes; else ``McpError`` saying how large
    it was (the value itself is dropped here: not kept, shown nor stored)."""
    try:
        size = len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8", "replace"))
    except (ValueError, RecursionError):  # nested past what JSON can write
        raise McpError(f"MCP server {server!r} returned a result that is not JSON data") from None
    if size > limit:
        raise McpError(
            f"MCP server {server!r} returned {size} bytes, more than max_result_bytes "
            f"({limit}); ask for less, or raise max_result_bytes"
        )
    return value


def _block(block: ContentBlock) -> Any:
    """One content block as JSON data; binary data is described, not passed on."""
    from mcp.types import EmbeddedResource, ResourceLink, TextContent, TextResourceContents

    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, ResourceLink):
        return {"type": "resource_link", "uri": str(block.uri), "name": block.name}
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        if isinstance(resource, TextResourceContents):
            return {"type": "resource", "uri": str(resource.uri), "text": resource.text}
        return {
            "type": "resource",
            "uri": str(resource.uri),
            "mime_type": resource.mime_type,
            "note": "binary data, not shown",
        }
    data = getattr(block, "data", "")
    return {
        "type": block.type,
        "mime_type": getattr(block, "mime_type", None),
        "note": f"{len(data) * 3 // 4} bytes of {block.type} data, not shown",
    }


def describe(exc: BaseException) -> str:
    """One line for ``exc``: each distinct cause in an exception group (however nested), with
    cancellations left out."""
    causes: list[str] = []
    pending: list[BaseException] = [exc]
    while pending and len(causes) < 5:
        current = pending.pop(0)
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
            continue
        if isinstance(current, asyncio.CancelledError):
            continue
        text = _one_cause(current)
        if text not in causes:
            causes.append(text)
    return bounded("; ".join(causes) or "the connection was cancelled")


def _one_cause(exc: BaseException) -> str:
    message = getattr(exc, "message", None) if type(exc).__name__ == "MCPError" else None
    text = str(message or exc).strip()
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.strerror}" + (f": {exc.filename}" if exc.filename else "")
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def bounded(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"
