"""An MCP tool's ``inputSchema`` → the parameters schema of a ``Tool``.

Our own tools have strict schemas: an object that lists its properties, names the required ones
and forbids any other (``additionalProperties: false``), so a model that invents an argument is
told so. MCP servers send whatever their framework wrote: often the properties without
``additionalProperties``, sometimes an older JSON Schema draft, ``$ref``s into ``$defs``, titles
on every property. ``normalise`` changes only what cannot change which arguments are valid —
or, for ``additionalProperties``, what the server declared — and says what it changed:

- ``$schema`` is dropped and draft-04/06/07 spellings become 2020-12 ones (the array form of
  ``items`` → ``prefixItems``, ``additionalItems`` → ``items``, boolean ``exclusiveMinimum`` /
  ``exclusiveMaximum`` → numbers): our validator speaks 2020-12;
- local ``$ref``s (``#/$defs/...``, ``#/definitions/...``) are inlined when they do not recurse,
  and ``title`` annotations dropped: one self-contained schema reads better to a small model
  and to the grammar builder; neither changes what validates;
- a missing ``type`` becomes ``object`` (MCP requires object arguments), a missing ``required``
  an empty list;
- with ``strict`` (the default), a schema that lists its ``properties`` and says nothing about
  other keys (no ``additionalProperties``, ``patternProperties``, ``unevaluatedProperties``,
  and no ``allOf``/``anyOf``/``oneOf``/``not``/``if``/``$ref``/``dependentSchemas`` at the top
  that could admit more) gets ``additionalProperties: false``: an argument the server never
  declared is refused before the call instead of being silently ignored by the server.

Everything else is validated as given: a schema with no ``properties`` (any arguments), with
``additionalProperties: true`` or a schema for extra keys, composed with ``allOf``/``anyOf``...,
or recursive ``$ref``s. A ``$ref`` to another document (a URL, a ``file://`` path) or a
``$dynamicRef`` is refused (``ValueError``): nothing a server lists is ever fetched or read.

A server is outside code, so its schema is then compiled as a caller's is
(``tools.validation.caller_schema``): its patterns run on RE2, in time linear in the text (a
server's ``^(a+)+$`` and a model's thirty ``a`` would hold Python's ``re`` for minutes), each
check within a step budget. A schema that cannot be compiled so (a backreference, a lookahead,
a ``$ref`` into a member that is no keyword) is refused with the reason. The client leaves a
tool whose schema is refused out, with a warning, and keeps its server's other tools.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hermes_agent.tools.validation import SchemaRefused, caller_schema, reference_problem

_LEGACY_DRAFTS = ("draft-04", "draft-06", "draft-07")
_OPEN_ENDED = (
    "additionalProperties",
    "patternProperties",
    "unevaluatedProperties",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "$ref",
    "dependentSchemas",
)
_MAX_DEPTH = 32


def normalise(
    schema: Mapping[str, Any] | None, *, strict: bool = True
) -> tuple[dict[str, Any], list[str]]:
    """The parameters schema for an MCP tool's ``inputSchema``, and a note per change that
    matters (dropped titles and ``$schema`` are not noted). Raises ``ValueError`` for a schema
    JSON cannot carry or that cannot be compiled as an outside schema (the reason said)."""
    try:
        copied: Any = json.loads(json.dumps(dict(schema or {})))
    except TypeError as exc:
        raise ValueError(f"the input schema is not JSON: {exc}") from None
    if not isinstance(copied, dict):
        raise ValueError("the input schema is not a JSON object")
    problem = reference_problem(copied)
    if problem is not None:
        raise ValueError(f"its input schema is refused: {problem}")
    notes: list[str] = []
    declared = str(copied.pop("$schema", ""))
    if any(draft in declared for draft in _LEGACY_DRAFTS) or _has_array_items(copied):
        copied = _to_2020(copied, 0)
        notes.append("rewrote draft-07 keywords in their 2020-12 form")
    if _has_ref(copied):
        definitions = _definitions(copied)
        body = {k: v for k, v in copied.items() if k not in ("$defs", "definitions")}
        try:
            copied = _inline(body, definitions, 0)
            notes.append("inlined $ref definitions")
        except _KeepAsGiven:
            pass  # recursive or external references: validated as given
    copied = _untitled(copied)
    if "type" not in copied:
        copied["type"] = "object"
        notes.append("added type: object")
    if isinstance(copied.get("properties"), dict):
        copied.setdefault("required", [])
        if strict and not any(key in copied for key in _OPEN_ENDED):
            copied["additionalProperties"] = False
            notes.append("added additionalProperties: false")
    try:
        caller_schema(copied, formats=True)  # the tool compiles it again, once, on first use
    except SchemaRefused as exc:
        raise ValueError(f"its input schema is refused: {exc}") from None
    return copied, notes


def is_strict(schema: Mapping[str, Any]) -> bool:
    """Whether ``schema`` refuses arguments it does not list (our tools' convention)."""
    return (
        isinstance(schema.get("properties"), dict) and schema.get("additionalProperties") is False
    )


def _definitions(schema: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key in ("definitions", "$defs"):
        table = schema.get(key)
        if isinstance(table, dict):
            found.update({f"#/{key}/{name}": value for name, value in table.items()})
    return found


class _KeepAsGiven(Exception):
    """A reference that cannot be inlined: it recurses, points elsewhere or nests too deep."""


def _inline(
    node: Any, definitions: Mapping[str, Any], depth: int, seen: tuple[str, ...] = ()
) -> Any:
    """``node`` with its local ``$ref``s replaced by what they point at (raises
    ``_KeepAsGiven`` when one cannot be)."""
    if depth > _MAX_DEPTH:
        raise _KeepAsGiven
    if isinstance(node, list):
        return [_inline(item, definitions, depth + 1, seen) for item in node]
    if not isinstance(node, dict):
        return node
    result: dict[str, Any] = {}
    ref = node.get("$ref")
    if isinstance(ref, str):
        if ref not in definitions or ref in seen:
            raise _KeepAsGiven
        target = _inline(definitions[ref], definitions, depth + 1, (*seen, ref))
        if not isinstance(target, dict):
            raise _KeepAsGiven
        result.update(target)
    for key, value in node.items():
        if key != "$ref":
            result[key] = _inline(value, definitions, depth + 1, seen)
    return result


def _has_ref(node: Any, depth: int = 0) -> bool:
    if depth > _MAX_DEPTH:
        return False
    if isinstance(node, dict):
        return "$ref" in node or any(_has_ref(value, depth + 1) for value in node.values())
    if isinstance(node, list):
        return any(_has_ref(item, depth + 1) for item in node)
    return False


def _untitled(node: Any) -> Any:
    """Drop ``title`` annotations, keeping properties that are called "title"."""
    if isinstance(node, list):
        return [_untitled(item) for item in node]
    if not isinstance(node, dict):
        return node
    cleaned: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(
            value, dict
        ):
            cleaned[key] = {name: _untitled(sub) for name, sub in value.items()}
        else:
            cleaned[key] = _untitled(value)
    return cleaned


def _has_array_items(node: Any, depth: int = 0) -> bool:
    if depth > _MAX_DEPTH:
        return False
    if isinstance(node, dict):
        if isinstance(node.get("items"), list):
            return True
        return any(_has_array_items(value, depth + 1) for value in node.values())
    if isinstance(node, list):
        return any(_has_array_items(item, depth + 1) for item in node)
    return False


def _to_2020(node: Any, depth: int) -> Any:
    """Draft-04/06/07 keywords in their 2020-12 spelling (same meaning)."""
    if depth > _MAX_DEPTH:
        return node
    if isinstance(node, list):
        return [_to_2020(item, depth + 1) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _to_2020(value, depth + 1) for key, value in node.items()}
    if isinstance(out.get("items"), list):
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        flag = out.get(bound)
        if isinstance(flag, bool):
            del out[bound]
            if flag and limit in out:
                out[bound] = out.pop(limit)
    return out
