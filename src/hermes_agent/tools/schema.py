"""Python signatures → strict JSON Schema for tool parameters.

The schema comes from the type hints (through pydantic, which knows every standard type) and the
parameter descriptions from the docstring (Google, NumPy or reST style, through docstring_parser).
Strict means: every parameter without a default is ``required`` and ``additionalProperties`` is
false, so a model that invents an argument is told so instead of having it silently dropped.

References (``$defs``) are inlined: small models and the GBNF grammar builder both do better with
one self-contained schema per tool. Titles pydantic adds are removed for the same reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints

import docstring_parser
from pydantic import BaseModel, ConfigDict, create_model

from hermes_agent.errors import ToolDefinitionError

_SKIPPED_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def describe_function(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The docstring's summary (short + long description) and its per-parameter descriptions."""
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    summary = "\n\n".join(part for part in (doc.short_description, doc.long_description) if part)
    params = {p.arg_name: p.description or "" for p in doc.params}
    return summary, params


def arguments_model(fn: Callable[..., Any]) -> type[BaseModel]:
    """A pydantic model of ``fn``'s parameters, used for the schema and for lax coercion."""
    try:
        hints = get_type_hints(fn)
    except Exception as exc:  # unresolvable forward references, typos in annotations
        raise ToolDefinitionError(
            f"cannot read the type hints of {fn.__qualname__}: {exc}. "
            "Make every annotation importable at definition time."
        ) from exc
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in _SKIPPED_KINDS:
            continue
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model: type[BaseModel] = create_model(  # type: ignore[call-overload]
        f"{fn.__name__}_arguments",
        __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
        **fields,
    )
    return model


def schema_from_function(fn: Callable[..., Any]) -> dict[str, Any]:
    """The strict JSON Schema of ``fn``'s parameters, with docstring descriptions."""
    try:
        raw = arguments_model(fn).model_json_schema()
    except Exception as exc:
        raise ToolDefinitionError(
            f"cannot build a JSON schema for {fn.__qualname__}: {exc}. "
            "Use JSON-compatible parameter types or pass parameters= explicitly."
        ) from exc
    schema = _clean(_inline_refs(raw, raw.get("$defs", {})))
    _, descriptions = describe_function(fn)
    properties: dict[str, Any] = schema.get("properties", {})
    for name, prop in properties.items():
        if descriptions.get(name):
            prop["description"] = descriptions[name]
    return strict_object(properties, schema.get("required", []))


def strict_object(properties: Mapping[str, Any], required: list[str]) -> dict[str, Any]:
    """An object schema that names its required keys and forbids any other."""
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }


def schema_from_mapping(
    parameters: Mapping[str, Any], fn: Callable[..., Any] | None = None
) -> dict[str, Any]:
    """A parameters schema given by hand: a full JSON Schema object, or the shorthand mapping
    ``{"city": {"type": "string"}, ...}`` (property name → schema).

    In the shorthand a property is required unless its schema has a ``default`` or the function's
    own parameter has one. A full schema is kept as given, made strict where it is silent.
    """
    if parameters.get("type") == "object" and isinstance(parameters.get("properties"), Mapping):
        schema = dict(parameters)
        schema.setdefault("additionalProperties", False)
        schema.setdefault("required", [])
        return schema
    for key, prop in parameters.items():
        if not isinstance(prop, Mapping):
            raise ToolDefinitionError(
                f"parameter {key!r} must map to a JSON Schema dict such as "
                f'{{"type": "string"}}, got {type(prop).__name__}'
            )
    defaults = _function_defaults(fn) if fn else set()
    required = [k for k, prop in parameters.items() if "default" not in prop and k not in defaults]
    return strict_object({k: dict(v) for k, v in parameters.items()}, required)


def _function_defaults(fn: Callable[..., Any]) -> set[str]:
    return {
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.default is not inspect.Parameter.empty
    }


def _inline_refs(node: Any, defs: Mapping[str, Any], depth: int = 0) -> Any:
    if depth > 32:
        raise ToolDefinitionError("tool parameter types nest too deeply (recursive model?)")
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = defs[ref.removeprefix("#/$defs/")]
            merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            return _inline_refs(merged, defs, depth + 1)
        return {k: _inline_refs(v, defs, depth + 1) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(item, defs, depth + 1) for item in node]
    return node


def _clean(node: Any) -> Any:
    """Drop pydantic's ``title`` keys (noise in a prompt), keeping properties named "title"."""
    if isinstance(node, dict):
        cleaned = {}
        for key, value in node.items():
            if key == "title" and isinstance(value, str):
                continue
            if key == "properties" and isinstance(value, dict):
                cleaned[key] = {name: _clean(prop) for name, prop in value.items()}
            else:
                cleaned[key] = _clean(value)
        return cleaned
    if isinstance(node, list):
        return [_clean(item) for item in node]
    return node
