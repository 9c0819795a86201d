"""What a tool returns when its answer is more than JSON: images, audio, embedded resources.

    from hermes_agent import tool
    from hermes_agent.tools.mcp import Content, Image, Resource

    @tool
    def chart(city: str) -> Content:
        "Plot the city's temperatures."
        return Content(f"Temperatures in {city}", Image(render_png(city), "image/png"))

Served over MCP (``hermes-agent mcp serve``), such a result is one MCP content block per part,
in order: a ``str`` is a text block, ``Image``/``Audio`` an image/audio block (base64 data and
its MIME type), ``Resource`` an embedded resource (text, or binary ``blob``). Any other result
is a text block holding its JSON, as before.

A ``Content`` is plain JSON data (a ``dict`` of one key, ``CONTENT_KEY``, holding the blocks in
MCP's own shape), so it survives everything a result goes through on its way: a subprocess
tool's pipe, the cache, the journal of a durable run, the trail. It is bounded like any result
(``max_result_chars``, 100,000 characters of JSON by default): base64 makes binary data a third
larger, and a result cut to that bound becomes text. A tool that returns larger images declares
a larger ``max_result_chars``. Inside a run of the agent's own model, the model reads the blocks
as JSON.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

CONTENT_KEY = "mcp_content"
"""The one key of a ``Content`` result; its value is the list of MCP content blocks."""


def _encoded(data: bytes | str) -> str:
    """Binary data as base64 text (``str``: already base64, checked)."""
    if isinstance(data, str):
        base64.b64decode(data, validate=True)  # binascii.Error when it is not base64
        return data
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True, slots=True)
class Image:
    """An image: its bytes (or their base64 text) and MIME type, e.g. ``image/png``."""

    data: bytes | str
    mime_type: str

    def block(self) -> dict[str, Any]:
        return {"type": "image", "data": _encoded(self.data), "mimeType": self.mime_type}


@dataclass(frozen=True, slots=True)
class Audio:
    """A sound: its bytes (or their base64 text) and MIME type, e.g. ``audio/wav``."""

    data: bytes | str
    mime_type: str

    def block(self) -> dict[str, Any]:
        return {"type": "audio", "data": _encoded(self.data), "mimeType": self.mime_type}


@dataclass(frozen=True, slots=True)
class Resource:
    """An embedded resource: its URI, MIME type and either ``text`` or binary ``blob``."""

    uri: str
    mime_type: str
    text: str | None = None
    blob: bytes | str | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.blob is None):
            raise ValueError("a Resource has either text or blob (one of them)")

    def block(self) -> dict[str, Any]:
        resource: dict[str, Any] = {"uri": self.uri, "mimeType": self.mime_type}
        if self.text is not None:
            resource["text"] = self.text
        else:
            assert self.blob is not None
            resource["blob"] = _encoded(self.blob)
        return {"type": "resource", "resource": resource}


Part = str | Image | Audio | Resource


class Content(dict[str, Any]):
    """A tool's result made of parts, in order: text (``str``), ``Image``, ``Audio``,
    ``Resource``. A ``dict`` (``{CONTENT_KEY: [blocks]}``), so it is JSON as it is."""

    def __init__(self, *parts: Part) -> None:
        blocks: list[dict[str, Any]] = []
        for part in parts:
            if isinstance(part, str):
                blocks.append({"type": "text", "text": part})
            elif isinstance(part, Image | Audio | Resource):
                blocks.append(part.block())
            else:
                raise TypeError(
                    f"a Content part is a str, Image, Audio or Resource, not {type(part).__name__}"
                )
        super().__init__({CONTENT_KEY: blocks})


def content_blocks(value: Any) -> list[dict[str, Any]] | None:
    """The blocks of a ``Content`` result (also after a trip through JSON); ``None`` when
    ``value`` is no such result."""
    if not isinstance(value, dict) or set(value) != {CONTENT_KEY}:
        return None
    blocks = value[CONTENT_KEY]
    if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
        return None
    return blocks
