"""What the run layer makes of a JSON Schema that came with a request (an ``output_schema``, a
``response_format`` or Responses ``text.format``, a client tool's parameters), after the size
budgets of ``pipeline.structured.schema_budget_problem`` (which count every ``$ref`` where it
points): it is compiled, as the engine will compile it (``tools.validation.caller_schema``), and
refused with the reason when it cannot be.

Compiled, not walked for keywords: a ``$ref`` must point at a subschema of the same document
(a member that is no keyword, another document, ``$dynamicRef`` are refused; nothing is ever
fetched, no file read); every ``pattern`` must compile on RE2, the linear-time engine it will run
on (backreferences and lookaround do not); the schema must be valid JSON Schema. Checking a value
against it then runs off the event loop, within a budget of keyword evaluations, in either
engine (``pipeline.tool_selector``, ``pipeline.thought_generator``).

A schema a developer writes in code (``Agent.run(output_type=...)`` with a pydantic type, a
tool's annotations) is trusted and keeps Python's ``re``; one a caller sends is not."""

from __future__ import annotations

from typing import Any

from hermes_agent.tools.validation import SchemaRefused, caller_schema


def compile_problem(
    schema: Any, what: str = "output_schema", *, formats: bool = False
) -> str | None:
    """Why a caller's ``schema`` cannot be compiled, or ``None`` (it then is, and the engine
    of this process finds it compiled). Call it after the size budgets."""
    if not isinstance(schema, dict):
        return f"{what} must be a JSON object"
    try:
        caller_schema(schema, formats=formats)
    except SchemaRefused as exc:
        return f"{what} cannot be used: {exc}"
    return None
