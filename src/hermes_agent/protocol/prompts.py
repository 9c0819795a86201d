"""System prompts of the Hermes protocol: function calling, scratch pad (GOAP), JSON mode, Qwen,
and explain mode (a one-line reason in the scratch pad).

The function-calling prompt follows the structure Hermes 2 Pro / Hermes 3 models were trained on
(the prompt format published with NousResearch's Hermes-Function-Calling repository): a role line,
the tool signatures as real JSON inside ``<tools></tools>``, the FunctionCall schema, and the
``<tool_call>`` instruction. The FunctionCall schema lists ``name`` before ``arguments`` because
models then emit the name first, which lets a streaming UI show which tool is being called early.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

FUNCTION_CALL_SCHEMA: dict[str, Any] = {
    "title": "FunctionCall",
    "type": "object",
    "properties": {
        "name": {"title": "Name", "type": "string"},
        "arguments": {"title": "Arguments", "type": "object"},
    },
    "required": ["name", "arguments"],
}

HERMES_ROLE = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user query. "
    "If none of the functions is relevant, answer in plain natural language. Don't make "
    "assumptions about what values to plug into functions. After a call you will receive the "
    "function results within <tool_response></tool_response> XML tags."
)
"""The role text of the Hermes function-calling prompt, as the Hermes models were trained on
it (the embedded model's ``call_bias`` is calibrated on it: it opens that model's prompt)."""

HONEST_ERRORS_RULE = "If a function fails, say so honestly; never make up its result."

HERMES_PREAMBLE = f"{HERMES_ROLE} {HONEST_ERRORS_RULE}"
"""The text that opens the Hermes function-calling prompt by default: the Hermes role text and
the rule to report a failed function honestly. Config ``prompt.preamble`` and
``Agent(preamble=...)`` replace it; the tool signatures, the FunctionCall schema and the
``<tool_call>`` instruction follow whatever opens it."""

TOOL_FAILURE_GUIDANCE = (
    "Retry the call if the error looks temporary, call another function that can answer, or "
    "tell the user that it failed."
)
"""What the model reads after the error of a failed call (a tool that raised, 500, or ran
past its timeout, 408)."""

_SCRATCH_PAD = (
    "Before calling functions, plan inside <scratch_pad></scratch_pad> XML tags using "
    "Goal-Oriented Action Planning:\n"
    "<scratch_pad>\n"
    "Goal: <the user's goal in one sentence>\n"
    "Actions: <the function calls to make, with their arguments>\n"
    "Observation: <what the function results showed, once you have them>\n"
    "Reflection: <whether the goal is met, or what to do next>\n"
    "</scratch_pad>\n"
    "then write the <tool_call></tool_call> blocks."
)

_CALL_INSTRUCTION = (
    "For each function call return a JSON object with the function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-dict>}\n'
    "</tool_call>"
)


def openai_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool in the OpenAI function format, the shape both Hermes and Qwen prompts embed."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def _tool_choice_line(tool_choice: str) -> str:
    if tool_choice == "required":
        return "You must call at least one of the functions."
    if tool_choice not in ("auto", "none"):
        return f"You must call the function {tool_choice}."
    return ""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def hermes_tools_prompt(
    tools: Sequence[dict[str, Any]],
    *,
    scratch_pad: bool = False,
    tool_choice: str = "auto",
    preamble: str | None = None,
) -> str:
    """The Hermes function-calling system prompt for ``tools`` (OpenAI-format dicts);
    ``preamble`` replaces the opening role text (``None``: ``HERMES_PREAMBLE``, ``""``: none)."""
    tool_lines = "\n".join(_dumps(tool) for tool in tools)
    opening = HERMES_PREAMBLE if preamble is None else preamble
    parts = [
        *([opening] if opening else []),
        f"Here are the available tools:\n<tools>\n{tool_lines}\n</tools>",
        "Use the following JSON schema for each tool call you will make: "
        + _dumps(FUNCTION_CALL_SCHEMA),
    ]
    if scratch_pad:
        parts.append(_SCRATCH_PAD)
    parts.append(_CALL_INSTRUCTION)
    choice = _tool_choice_line(tool_choice)
    if choice:
        parts.append(choice)
    return "\n".join(parts)


def qwen_tools_prompt(tools: Sequence[dict[str, Any]], *, tool_choice: str = "auto") -> str:
    """The Qwen2.5 ``# Tools`` block, appended to the system message by ``chat_format: qwen``."""
    tool_lines = "\n".join(_dumps(tool) for tool in tools)
    text = (
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{tool_lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        "<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )
    choice = _tool_choice_line(tool_choice)
    return f"{text}\n{choice}" if choice else text


def json_mode_prompt(schema: dict[str, Any], *, with_tools: bool = False) -> str:
    """The JSON-mode system prompt: answer with one JSON object matching ``schema``.

    ``with_tools``: the answer comes after any function calls, so the instruction is about the
    final answer, not about every turn (a call is still written as a ``<tool_call>``).
    """
    if with_tools:
        return (
            "When you give your final answer (after any function calls), answer in JSON: one "
            "JSON value and nothing else, no code fences. "
            "Here's the JSON schema your answer must adhere to:\n"
            f"<schema>\n{_dumps(schema)}\n</schema>"
        )
    return (
        "You are a helpful assistant that answers in JSON. "
        "Here's the JSON schema you must adhere to:\n"
        f"<schema>\n{_dumps(schema)}\n</schema>"
    )


def json_retry_prompt(problems: Sequence[str]) -> str:
    """What the model reads after an answer that does not match the JSON-mode schema."""
    listed = "\n".join(f"- {problem}" for problem in problems)
    return (
        "Your answer does not match the JSON schema in <schema></schema>:\n"
        f"{listed}\n"
        "Answer again with only the corrected JSON, nothing else."
    )


EXPLAIN_PROMPT = (
    "Explain each decision: begin every reply with one line of reason inside "
    "<scratch_pad></scratch_pad> XML tags, as follows:\n"
    "<scratch_pad>\n"
    "Reason: <in one line, why you call these functions, or why you answer now>\n"
    "</scratch_pad>\n"
    "then write your function calls or your answer."
)
"""Explain mode: the instruction that asks for a one-line reason with every turn."""
