"""Messages ⇄ Hermes wire text: ChatML turns, ``<tool_call>`` and ``<tool_response>`` blocks.

``render_conversation`` turns protocol-neutral ``Message`` objects into the role/content pairs a
Hermes-speaking model reads (system prompt with tools, assistant calls as text, tool results as
``<tool_response>`` JSON). ``to_chatml`` joins such pairs into the single ChatML string that an
embedded model completes.

Content is never control: every turn's text passes through ``escape_content`` (user, assistant,
tool results, system instructions with their variables, summaries, a client's history, tool
descriptions), so the only control tokens in a prompt are the template's own markers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from hermes_agent.protocol.prompts import hermes_tools_prompt, qwen_tools_prompt
from hermes_agent.types import Message, ToolCall, ToolResult

CHAT_FORMATS = ("hermes", "qwen")

WireMessage = dict[str, str]

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
"""The template's own markers: the only text of a ChatML prompt meant as control tokens."""

# The bare (bar-less) control tokens of the bundled SmolLM2's vocabulary (StarCoder's names).
# Every ``<|...|>`` or ``<｜...｜>`` token (ChatML, Qwen, Llama 3, Phi, DeepSeek) is covered by
# the bar that follows its ``<``.
_BARE_CONTROL_NAMES = (
    "repo_name", "reponame", "file_sep", "filename", "gh_stars", "issue_start", "issue_comment",
    "issue_closed", "jupyter_start", "jupyter_text", "jupyter_code", "jupyter_output",
    "jupyter_script", "empty_output",
)  # fmt: skip
_CONTROL_START = re.compile(
    "<(?=[|\uff5c]|(?:" + "|".join(_BARE_CONTROL_NAMES) + ")>)"
)  # the "<" that begins a control token's text
_BREAK = "<\u200b"  # a zero-width space after it: the model reads the same, no tokenizer matches


def escape_content(text: str) -> str:
    r"""``text`` as prompt text that no tokenizer reads as a control token.

    A zero-width space goes after the ``<`` of every control-token string: ``<|im_start|>``,
    ``<|im_end|>``, ``<|endoftext|>`` and any other ``<|...|>`` (or DeepSeek's ``<｜...｜>``),
    and the bundled model's bare ones (``<file_sep>``, ...). Text without them is unchanged.

    >>> escape_content("hi<|im_end|>") == "hi<\u200b|im_end|>"
    True
    """
    if "<" not in text:
        return text
    return _CONTROL_START.sub(_BREAK, text)


def to_json(value: Any) -> str:
    """JSON as the protocol wants it: real UTF-8, ``None`` → ``null``, the rest → ``str``."""
    return json.dumps(value, ensure_ascii=False, default=str)


TOOL_CALL_OPEN = "<tool_call>\n"
TOOL_CALL_CLOSE = "\n</tool_call>"


def wrap_tool_call(body: str) -> str:
    """A ``<tool_call>`` block around ``body`` (JSON text, whole or not)."""
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"


def render_tool_call(call: ToolCall) -> str:
    """One ``<tool_call>`` block, name first."""
    return wrap_tool_call(to_json({"name": call.name, "arguments": call.arguments}))


def render_tool_results(results: Sequence[ToolResult]) -> str:
    """All results of one assistant turn, one ``<tool_response>`` block each, in one message."""
    blocks = [
        f"<tool_response>\n{to_json({'name': r.name, 'content': r.content})}\n</tool_response>"
        for r in results
    ]
    return "\n".join(blocks)


def render_assistant(message: Message) -> str:
    """An assistant turn as the model would have written it (verbatim when it was malformed)."""
    if message.raw is not None:
        return message.raw
    parts: list[str] = []
    if message.scratch_pad:
        parts.append(f"<scratch_pad>\n{message.scratch_pad}\n</scratch_pad>")
    if message.content:
        parts.append(message.content)
    parts.extend(render_tool_call(call) for call in message.tool_calls)
    return "\n".join(parts)


def render_conversation(
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] = (),
    *,
    chat_format: str = "hermes",
    scratch_pad: bool = False,
    tool_choice: str = "auto",
    preamble: str | None = None,
) -> list[WireMessage]:
    """Render ``messages`` for a Hermes (or Qwen) model that reads tools from the system prompt.

    ``tools`` are OpenAI-format tool dicts. The tools prompt leads the system turn; a system
    message among ``messages`` (the agent's own instructions) follows it in the same turn.
    With ``tool_choice="none"`` the tools are left out, so the model cannot call one.
    ``preamble`` replaces the Hermes prompt's opening role text (``prompts.HERMES_PREAMBLE``).
    """
    if chat_format not in CHAT_FORMATS:
        raise ValueError(f"chat_format must be one of {CHAT_FORMATS}, got {chat_format!r}")
    system_parts: list[str] = []
    if tools and tool_choice != "none" and chat_format == "hermes":
        system_parts.append(
            hermes_tools_prompt(
                tools, scratch_pad=scratch_pad, tool_choice=tool_choice, preamble=preamble
            )
        )
    system_parts.extend(m.content for m in messages if m.role == "system" and m.content)
    if tools and tool_choice != "none" and chat_format == "qwen":
        system_parts.append(qwen_tools_prompt(tools, tool_choice=tool_choice))

    wire: list[WireMessage] = []
    if system_parts:
        wire.append(render_system(system_parts))
    wire.extend(render_turn(m, chat_format) for m in messages if m.role != "system")
    return wire


def render_system(parts: Sequence[str]) -> WireMessage:
    """The one system turn: the tools prompt and the system messages, escaped."""
    return {"role": "system", "content": escape_content("\n\n".join(parts))}


def render_turn(message: Message, chat_format: str = "hermes") -> WireMessage:
    """One non-system message as a wire turn, its content escaped (tool results go in a
    ``tool`` turn for ``hermes``, a ``user`` turn for ``qwen``)."""
    role: str = message.role
    if role == "assistant":
        content = render_assistant(message)
    elif role == "tool":
        role = "tool" if chat_format == "hermes" else "user"
        content = render_tool_results(message.tool_results)
    else:
        content = message.content
    return {"role": role, "content": escape_content(content)}


def to_chatml(wire: Sequence[WireMessage], *, add_generation_prompt: bool = True) -> str:
    """Join role/content pairs into ChatML text, ending with an open assistant turn.

    The pairs are those ``render_conversation`` made (their content already escaped), so the
    ``CHATML_MARKERS`` placed here are the only control tokens in the text.
    """
    start, end = CHATML_MARKERS
    text = "".join(f"{start}{m['role']}\n{m['content']}{end}\n" for m in wire)
    if add_generation_prompt:
        text += f"{start}assistant\n"
    return text
