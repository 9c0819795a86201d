"""Keep the rendered prompt inside the model's context window.

Before each model request, when the model's profile states a ``context_window``, the prompt is
rendered as the model sends it (``render_prompt``) and counted with the model's ``count_tokens``
(llama.cpp's own tokenizer; an estimate of one token per three characters elsewhere, which errs
on the safe side for English and code). If it does not fit with room for the answer, older
history turns are dropped first, then the largest tool results are cut (with a note the model
reads) until it fits. Only the prompt is trimmed: the session keeps every message whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hermes_agent.pipeline.context import RunContext
from hermes_agent.protocol.chatml import to_json
from hermes_agent.types import ToolResult

DEFAULT_ANSWER_RESERVE = 256
_MIN_RESULT_CHARS = 80


def fit_to_context(ctx: RunContext) -> None:
    """Trim ``ctx.messages`` (a working copy of the conversation) until the prompt fits."""
    profile = ctx.model.profile
    window = profile.context_window
    if window is None or window <= 0:
        return
    settings = ctx.turn_settings or ctx.settings
    reserve = settings.max_tokens or profile.max_tokens or DEFAULT_ANSWER_RESERVE
    budget = window - reserve
    measure = _measurer(ctx)
    if measure() <= budget:
        return
    ctx.prompt_rewrites += 1
    while measure() > budget and _drop_oldest_turn(ctx):
        pass
    while measure() > budget and _cut_largest_result(ctx):
        pass


def _measurer(ctx: RunContext) -> Callable[[], int]:
    model = ctx.model
    settings = ctx.turn_settings or ctx.settings

    def measure() -> int:
        return model.count_tokens(model.render_prompt(ctx.messages, ctx.tool_specs, settings))

    return measure


def _drop_oldest_turn(ctx: RunContext) -> bool:
    """Remove the oldest history turn (a user message and what answered it), if any."""
    current = len(ctx.messages) - len(ctx.new_messages)  # first message of this run
    first = 1 if ctx.messages and ctx.messages[0].role == "system" else 0
    if ctx.messages[first:current] and ctx.messages[first].role == "system":
        first += 1  # keep the history summary; it is short by construction
    if first >= current:
        return False
    end = first + 1
    while end < current and ctx.messages[end].role != "user":
        end += 1
    del ctx.messages[first:end]
    return True


def _cut_largest_result(ctx: RunContext) -> bool:
    """Halve the largest tool result in the prompt; False when none is worth cutting."""
    best: tuple[int, int, int] | None = None  # (size, message index, result index)
    for m_index, message in enumerate(ctx.messages):
        for r_index, result in enumerate(message.tool_results):
            size = len(to_json(result.content))
            if size > _MIN_RESULT_CHARS and (best is None or size > best[0]):
                best = (size, m_index, r_index)
    if best is None:
        return False
    size, m_index, r_index = best
    message = ctx.messages[m_index]
    results = list(message.tool_results)
    results[r_index] = _shortened(results[r_index], size // 2)
    # A copy: the session keeps the full result, only this prompt gets the short one.
    ctx.messages[m_index] = dataclasses.replace(message, tool_results=results)
    return True


def _shortened(result: ToolResult, limit: int) -> ToolResult:
    content: Any = result.content
    data = content.get("data") if isinstance(content, dict) and "data" in content else content
    text = data if isinstance(data, str) else to_json(data)
    original = _original_size(content, len(text))
    note = f"… [cut to fit the context window: {original:,} characters in total]"
    short = text[: max(0, limit - len(note))] + note
    if isinstance(content, dict) and "data" in content:
        new_content: Any = {**content, "data": short}
        new_content["metadata"] = {**content.get("metadata", {}), "original_chars": original}
    else:
        new_content = short
    return dataclasses.replace(result, content=new_content)


def _original_size(content: Any, fallback: int) -> int:
    if isinstance(content, dict):
        size = content.get("metadata", {}).get("original_chars")
        if isinstance(size, int):
            return size
    return fallback
