"""Renderers: the final answer in the format a channel needs.

Built in: ``text`` (the answer as is), ``markdown`` (the answer, plus a table when a tool returned
records), ``json`` (answer, status and tool data as one JSON object) and ``table`` (a markdown
table of the latest tool records; ``pipeline.tables`` says which data counts as records, and how
columns are named, rows capped and CJK text aligned — the config's ``output.table``).
A renderer is chosen per call (``output_format=``, or ``channel=``: the agent's
``channel_formats`` map a channel's name to a format) or in the config (``output.format``,
``output.channel_formats``); custom ones are added with ``agent.add_renderer(name, function)`` —
a function of ``RenderInput`` returning a string.

A channel here is where an answer is shown (``cli``, ``web``, a chat app); the deliveries of
``hermes_agent.channels`` (webhook, WeCom, email) name their renderer themselves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hermes_agent.pipeline.tables import TableRenderer, markdown_table
from hermes_agent.types import RenderedMessage, ToolCallRecord

__all__ = [
    "BUILTIN_RENDERERS",
    "DEFAULT_CHANNEL_FORMATS",
    "RenderInput",
    "RenderedMessage",
    "Renderer",
    "markdown_table",
    "rendered",
]

DEFAULT_CHANNEL_FORMATS = {"cli": "text", "terminal": "text", "web": "markdown", "api": "json"}
"""A channel's name → the format (renderer name) of its answers, unless the agent maps it
otherwise (``Agent(channel_formats=...)``)."""


@dataclass(slots=True)
class RenderInput:
    """What a renderer sees: the answer, the run's status, every tool call with its data, the
    channel the answer is for (``None`` when the run named none) and the run's variables (a
    copy: ``lang``, say)."""

    output: str
    status: int
    tool_calls: list[ToolCallRecord]
    channel: str | None = None
    variables: dict[str, object] = field(default_factory=dict)

    def latest_records(self) -> list[dict[str, Any]] | None:
        """The most recent successful tool data that is a non-empty list of dicts."""
        for call in reversed(self.tool_calls):
            data = call.result
            if call.error is not None or not isinstance(data, list) or not data:
                continue
            rows = [row for row in data if isinstance(row, dict)]
            if len(rows) == len(data):
                return rows
        return None


Renderer = Callable[[RenderInput], str]


def render_text(view: RenderInput) -> str:
    return view.output


render_table: Renderer = TableRenderer()
render_markdown: Renderer = TableRenderer(with_answer=True)


def render_json(view: RenderInput) -> str:
    document = {
        "output": view.output,
        "status": view.status,
        "tool_results": [
            {"name": call.name, "data": call.result}
            for call in view.tool_calls
            if call.error is None
        ],
    }
    return json.dumps(document, ensure_ascii=False, default=str)


BUILTIN_RENDERERS: dict[str, Renderer] = {
    "text": render_text,
    "markdown": render_markdown,
    "json": render_json,
    "table": render_table,
}


def rendered(view: RenderInput, name: str, renderer: Renderer) -> RenderedMessage:
    sources = list(dict.fromkeys(c.name for c in view.tool_calls if c.error is None))
    return RenderedMessage(
        content=renderer(view),
        format=name,
        metadata={"rendered_at": time.time(), "source_tools": sources},
    )
