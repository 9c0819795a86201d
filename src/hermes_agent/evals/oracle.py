"""The oracle: a ``ScriptedModel`` that answers every BFCL case with its ground truth.

It writes what a perfect model would write — Hermes ``<tool_call>`` text — so a run through the
harness with it measures only our side: prompt, parser, schema conversion, validation,
execution and decoding for the checker. Anything below 100% is our bug or a quirk of the data.

- Single-turn cases: one completion with every ground-truth call. For each argument the first
  acceptable value that passes the converted schema is used; an optional argument (``""`` among
  its values) is left out.
- Irrelevance cases: a plain-text answer, no call.
- Multi-turn cases: for the n-th user turn, the n-th list of ground-truth calls (Python call
  strings such as ``cd(folder='document')``, positional arguments named from the backend
  method's signature); once the results are back, a short text answer ends the turn.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from jsonschema import Draft202012Validator

from hermes_agent.models.scripted import ScriptedModel
from hermes_agent.protocol.chatml import render_tool_call
from hermes_agent.types import Message, ToolCall

NO_CALL_ANSWER = "None of the available functions can answer this request."
TURN_DONE_ANSWER = "Done."


def choose_arguments(
    possible: Mapping[str, Sequence[Any]], schema: Mapping[str, Any]
) -> dict[str, Any]:
    """One set of arguments out of BFCL possible answers (``{param: [acceptable values]}``)."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    arguments: dict[str, Any] = {}
    for name, options in possible.items():
        if ("" in options and name not in required) or not options:
            continue  # optional: leaving it out is always acceptable (none listed: nothing is)
        candidates = [_resolve(option) for option in options if option != ""] or list(options)
        validator = Draft202012Validator(properties.get(name, {}))
        valid = [option for option in candidates if validator.is_valid(option)]
        arguments[name] = (valid or candidates)[0]
    return arguments


def _resolve(option: Any) -> Any:
    """A possible answer → a value. BFCL writes a dict's possible answer as a dict of
    acceptable-value lists (and a list of dicts as a list of those): take the first value of
    each key, leaving out optional keys."""
    if isinstance(option, dict):
        resolved = {}
        for key, values in option.items():
            if not isinstance(values, list):
                resolved[key] = values
            elif "" not in values and values:
                resolved[key] = _resolve(values[0])
        return resolved
    if isinstance(option, list) and option and all(isinstance(item, dict) for item in option):
        return [_resolve(item) for item in option]
    return option


def ast_answer(ground_truth: Sequence[Mapping[str, Any]], schemas: Mapping[str, Any]) -> str:
    """The completion for a single-turn case: all ground-truth calls, or text when none."""
    if not ground_truth:
        return NO_CALL_ANSWER
    blocks = []
    for item in ground_truth:
        ((name, possible),) = item.items()
        arguments = choose_arguments(possible, schemas.get(name, {}))
        blocks.append(render_tool_call(ToolCall(name, arguments)))
    return "\n".join(blocks)


def parse_call_string(text: str, signatures: Mapping[str, Sequence[str]]) -> ToolCall:
    """``"mv(source='a', destination='b')"`` → ToolCall; positional arguments are named from
    ``signatures`` (function name → parameter names in order)."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    name = node.func.id
    parameters = list(signatures.get(name, ()))
    arguments: dict[str, Any] = {}
    for position, value in enumerate(node.args):
        if position >= len(parameters):
            raise ValueError(f"{text!r}: more positional arguments than {name} takes")
        arguments[parameters[position]] = _plain(ast.literal_eval(value))
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ValueError(f"{text!r}: **kwargs in a ground-truth call")
        arguments[keyword.arg] = _plain(ast.literal_eval(keyword.value))
    return ToolCall(name, arguments)


def _plain(value: Any) -> Any:
    """Tuples become lists (JSON has no tuples; BFCL compares them as lists)."""
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def method_signatures(instances: Sequence[object]) -> dict[str, list[str]]:
    """Public method name → parameter names, for the backend instances of a case."""
    signatures: dict[str, list[str]] = {}
    for instance in instances:
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                signatures[name] = list(inspect.signature(method).parameters)
    return signatures


def single_turn_oracle(
    ground_truth: Sequence[Mapping[str, Any]], schemas: Mapping[str, Any]
) -> ScriptedModel:
    """The oracle for one single-turn case."""
    answer = ast_answer(ground_truth, schemas)
    return ScriptedModel(lambda messages, tools: answer, name="oracle")


def multi_turn_oracle(
    ground_truth: Sequence[Sequence[str]], signatures: Mapping[str, Sequence[str]]
) -> ScriptedModel:
    """The oracle for one multi-turn case: the n-th user turn gets the n-th ground-truth calls."""
    turns = [[parse_call_string(text, signatures) for text in turn] for turn in ground_truth]

    def answer(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
        if messages and messages[-1].role == "tool":
            return TURN_DONE_ANSWER
        turn = sum(message.role == "user" for message in messages) - 1
        calls = turns[turn] if 0 <= turn < len(turns) else []
        if not calls:
            return NO_CALL_ANSWER
        return "\n".join(render_tool_call(ToolCall(c.name, c.arguments)) for c in calls)

    return ScriptedModel(answer, name="oracle")
