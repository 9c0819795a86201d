"""What a tool served over MCP returns beyond JSON, and the progress it reports while it runs.

A tool returns ``Content`` (text, ``Image``, ``Audio``, ``Resource``) and the MCP caller gets
one content block per part, its bytes intact; a tool calls ``report_progress`` and a caller
that asked for progress hears every report, in order, before the result. Through the
agent's MCP server and the SDK's own client, in memory.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel, tool
from hermes_agent.tools.mcp import Audio, Content, Image, Resource, report_progress
from hermes_agent.tools.mcp.content import CONTENT_KEY, content_blocks

pytest.importorskip("mcp")

from mcp import Client

from hermes_agent.mcp.server import AgentMcpServer

PIXEL = bytes.fromhex("89504e470d0a1a0a") + b"\x00pixel"
SOUND = b"RIFF\x00\x00\x00\x00WAVE"


@tool
def chart(city: str) -> Content:
    """Plot a city's temperatures.

    Args:
        city: The city.
    """
    return Content(
        f"Temperatures in {city}",
        Image(PIXEL, "image/png"),
        Audio(SOUND, "audio/wav"),
        Resource("file:///notes.txt", "text/plain", text="warm"),
        Resource("file:///raw.bin", "application/octet-stream", blob=b"\x00\x01"),
    )


@tool
def not_blocks() -> dict[str, Any]:
    """Return a look-alike whose blocks MCP does not know."""
    return {CONTENT_KEY: [{"type": "hologram"}]}


@tool
def count_sync(steps: int) -> bool:
    """Count on a tool thread, reporting each step.

    Args:
        steps: How many.
    """
    heard = True
    for step in range(1, steps + 1):
        heard = report_progress(step, steps, f"step {step}") and heard
    return heard


@tool
async def count_async(steps: int) -> bool:
    """Count on the loop, reporting each step.

    Args:
        steps: How many.
    """
    heard = True
    for step in range(1, steps + 1):
        heard = report_progress(step, steps, f"step {step}") and heard
        await asyncio.sleep(0)  # one turn of the loop: each report goes out before the next
    return heard


def serve(*tools: Any) -> tuple[AgentMcpServer, Agent]:
    agent = Agent(ScriptedModel(["unused"]), tools=list(tools))
    return AgentMcpServer(agent), agent


def test_content_parts_become_mcp_blocks_with_their_bytes_intact() -> None:
    server, agent = serve(chart)

    async def main() -> Any:
        async with Client(server.lowlevel(), read_timeout_seconds=30) as client:
            return await client.call_tool("chart", {"city": "Oslo"})

    try:
        result = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        server.close()
        agent.close()
    assert not result.is_error
    text, image, audio, notes, raw = result.content
    assert text.type == "text" and text.text == "Temperatures in Oslo"
    assert image.type == "image" and image.mime_type == "image/png"
    assert base64.b64decode(image.data) == PIXEL
    assert audio.type == "audio" and audio.mime_type == "audio/wav"
    assert base64.b64decode(audio.data) == SOUND
    assert notes.type == "resource" and notes.resource.text == "warm"
    assert str(notes.resource.uri) == "file:///notes.txt"
    assert raw.type == "resource" and base64.b64decode(raw.resource.blob) == b"\x00\x01"
    assert raw.resource.mime_type == "application/octet-stream"


def test_content_is_json_and_survives_a_trip_through_it() -> None:
    """A subprocess tool's pipe, the cache and a durable run's journal carry JSON only."""
    made = Content("hi", Image(PIXEL, "image/png"))
    again = json.loads(json.dumps(made))
    assert content_blocks(again) == content_blocks(made)
    assert content_blocks(again) == [
        {"type": "text", "text": "hi"},
        {"type": "image", "data": base64.b64encode(PIXEL).decode(), "mimeType": "image/png"},
    ]
    assert content_blocks({"mcp_content": [], "other": 1}) is None
    assert content_blocks("text") is None


def test_parts_are_checked_when_the_tool_makes_them() -> None:
    with pytest.raises(TypeError, match="Image"):
        Content(b"raw bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="either text or blob"):
        Resource("file:///x", "text/plain")
    with pytest.raises(ValueError):
        Content(Image("not base64!", "image/png"))
    assert content_blocks(Content(Image(base64.b64encode(PIXEL).decode(), "image/png")))


def test_blocks_mcp_does_not_know_go_as_their_json() -> None:
    server, agent = serve(not_blocks)

    async def main() -> Any:
        async with Client(server.lowlevel(), read_timeout_seconds=30) as client:
            return await client.call_tool("not_blocks", {})

    try:
        result = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        server.close()
        agent.close()
    assert not result.is_error
    (only,) = result.content
    assert json.loads(only.text) == {CONTENT_KEY: [{"type": "hologram"}]}


@pytest.mark.parametrize("name", ["count_sync", "count_async"])
def test_progress_reaches_the_caller_in_order_before_the_result(name: str) -> None:
    server, agent = serve(count_sync, count_async)
    heard: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        heard.append((value, total, message))

    async def main() -> tuple[Any, Any]:
        async with Client(server.lowlevel(), read_timeout_seconds=30) as client:
            asked = await client.call_tool(name, {"steps": 3}, progress_callback=progress)
            received = list(heard)  # what had arrived when the result did
            unasked = await client.call_tool(name, {"steps": 2})
            return (asked, received), unasked

    try:
        (asked, received), unasked = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        server.close()
        agent.close()
    assert received == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
    assert asked.content[0].text == "true"
    # A caller that asked for no progress hears none (the call still runs as it does).
    assert unasked.content[0].text == "true" and not unasked.is_error
    assert len(heard) == 3


def test_progress_outside_an_mcp_call_goes_nowhere() -> None:
    assert report_progress(1, 2, "half") is False
