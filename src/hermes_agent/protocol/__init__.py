"""The Hermes wire format, a public module: ChatML turns, ``<tool_call>`` and ``<tool_response>``
blocks, the tools prompt, and the parser that reads a model's completion back.

    from hermes_agent.protocol import StreamParser, ToolCallFinished, parse_completion

    parse_completion('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>').tool_calls

``parser`` reads completions (whole or streamed, with the notes it may leave; a template that
opens the thought is read with ``in_thought=True``), ``stream_events`` the events it streams,
``decoding`` the lenient reading of one block, ``chatml`` renders a conversation, ``prompts``
the tools prompt, ``grammar`` the GBNF grammar a constrained model decodes in. Import from
here, not from those.
"""

from __future__ import annotations

from hermes_agent.protocol.chatml import escape_content, render_conversation, to_chatml
from hermes_agent.protocol.grammar import build_grammar
from hermes_agent.protocol.parser import (
    MAX_NESTING,
    NOTE_CALL_IN_THOUGHT,
    NOTE_REVEALED_THOUGHT,
    NOTE_UNCLOSED_THOUGHT,
    SPECIAL_TOKENS,
    ScratchPadDelta,
    StreamEvent,
    StreamParser,
    TextDelta,
    ThoughtDelta,
    ThoughtRevealed,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
    decode_value,
    parse_completion,
)
from hermes_agent.protocol.prompts import hermes_tools_prompt

__all__ = [
    "MAX_NESTING",
    "NOTE_CALL_IN_THOUGHT",
    "NOTE_REVEALED_THOUGHT",
    "NOTE_UNCLOSED_THOUGHT",
    "SPECIAL_TOKENS",
    "ScratchPadDelta",
    "StreamEvent",
    "StreamParser",
    "TextDelta",
    "ThoughtDelta",
    "ThoughtRevealed",
    "ToolCallArgumentsDelta",
    "ToolCallFinished",
    "ToolCallStarted",
    "build_grammar",
    "decode_value",
    "escape_content",
    "hermes_tools_prompt",
    "parse_completion",
    "render_conversation",
    "to_chatml",
]
