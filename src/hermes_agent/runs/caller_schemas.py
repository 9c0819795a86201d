"""What the run layer refuses in a JSON Schema that came with a request (an ``output_schema``,
a ``response_format``, a client tool's parameters), beyond the size budgets of
``pipeline.structured.schema_budget_problem``: regular expressions.

The validators (jsonschema, fastjsonschema) match ``pattern``, ``patternProperties`` and
``format: regex`` with Python's ``re``, which backtracks: ``^(a+)+$`` against thirty ``a`` and
a ``!`` takes minutes, on the event loop or a worker's run loop, where no timeout can interrupt
it. A schema a developer writes in code (``Agent.run(output_type=...)``, a tool's annotations)
is trusted and keeps its patterns; one a caller sends is not."""

from __future__ import annotations

from typing import Any

_SCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")
"""Keywords whose value maps names to subschemas (the names are not keywords)."""
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMAS = (
    "items",
    "additionalProperties",
    "additionalItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
    "unevaluatedItems",
)


def regex_problem(schema: Any, what: str = "output_schema") -> str | None:
    """Why a caller's ``schema`` is refused for holding a regular expression, or ``None``.
    Walks the schema's subschemas (not property names), iteratively; call it after the size
    budgets so the walk is bounded."""
    pending: list[Any] = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for keyword in ("pattern", "patternProperties"):
            if keyword in node:
                return _refusal(what, f"'{keyword}'")
        if node.get("format") == "regex":
            return _refusal(what, "'format: regex'")
        for keyword in _SCHEMA_MAPS:
            value = node.get(keyword)
            if isinstance(value, dict):
                pending.extend(value.values())
        for keyword in _SCHEMA_LISTS:
            value = node.get(keyword)
            if isinstance(value, list):
                pending.extend(value)
        for keyword in _SCHEMAS:
            if keyword in node:
                pending.append(node[keyword])
    return None


def _refusal(what: str, keyword: str) -> str:
    return (
        f"{what} uses {keyword}: regular expressions from a request are not accepted (matching "
        "one can take exponential time); describe the format in 'description', or check it in "
        "your own code"
    )
