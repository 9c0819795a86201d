"""The model seam: one async method to complete a conversation, one to stream it.

A model receives protocol-neutral ``Message`` objects and the tools as OpenAI-format dicts, and
decides how to put them on its wire: a Hermes model renders the system prompt with
``protocol.chatml.render_conversation``; an OpenAI-compatible endpoint in ``native`` mode sends
``tools`` as structured data. Either way it returns a parsed ``Completion`` plus the raw text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from hermes_agent.types import Message, ModelResponse, StreamChunk


@dataclass(slots=True)
class ModelSettings:
    """Per-request generation settings; ``None`` means the model's own default."""

    temperature: float | None = None
    max_tokens: int | None = None
    tool_choice: str = "auto"
    scratch_pad: bool = False


@runtime_checkable
class Model(Protocol):
    """Anything that can complete a conversation. Implement ``complete``; ``stream`` is optional
    in spirit (a model may yield its whole completion as one chunk)."""

    name: str

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> ModelResponse:
        """Return the model's next turn for ``messages``."""
        ...

    def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> AsyncIterator[StreamChunk]:
        """Yield the next turn as Hermes-format text chunks; the last chunk carries usage."""
        ...
