"""The tools the MCP conformance suite's server scenarios call, written as a tool author writes
tools (``hermes-agent mcp serve --tools mcp_conformance_tools.py``): test_mcp_conformance.py.

Each does what its scenario asks of a server's tool and nothing more. The suite's other
fixtures (resources, prompts, completions, sampling) have no counterpart here: the agent's
MCP server serves tools only (the baseline says so, scenario by scenario).
"""

from __future__ import annotations

import base64

from hermes_agent import tool
from hermes_agent.tools.mcp import Audio, Content, Image, Resource, report_progress

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
"""A 1x1 PNG."""
WAV = (
    b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00"
    b"@\x1f\x00\x00@\x1f\x00\x00\x01\x00\x08\x00data\x00\x00\x00\x00"
)
"""An empty 8 kHz mono WAV."""
RESOURCE_URI = "test://embedded-resource"


@tool
def test_simple_text() -> str:
    """Answer with a short text."""
    return "This is a simple text response for testing."


@tool
def test_error_handling() -> str:
    """Fail, always."""
    raise RuntimeError("This tool intentionally returns an error for testing")


@tool
def test_image_content() -> Content:
    """Answer with an image."""
    return Content(Image(PNG, "image/png"))


@tool
def test_audio_content() -> Content:
    """Answer with a sound."""
    return Content(Audio(WAV, "audio/wav"))


@tool
def test_embedded_resource() -> Content:
    """Answer with an embedded resource."""
    return Content(Resource(RESOURCE_URI, "text/plain", text="This is an embedded resource."))


@tool
def test_multiple_content_types() -> Content:
    """Answer with a text, an image and a resource."""
    resource = Resource(RESOURCE_URI, "application/json", text='{"test": "data", "value": 123}')
    return Content("Multiple content types test:", Image(PNG, "image/png"), resource)


@tool
async def test_tool_with_progress() -> str:
    """Report progress three times, then answer."""
    for done in (0, 50, 100):
        report_progress(done, 100, f"{done}% done")
    return "progress reported"
