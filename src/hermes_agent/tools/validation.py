"""Tool arguments → a list of errors a model can act on.

jsonschema does the checking; this module only words its findings the way a model (or a person
reading a trace) needs them: which argument, what was wrong, what is allowed. Each message names
the argument so a small model can fix exactly that one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import fastjsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean (true or false)",
    "object": "an object",
    "array": "an array",
    "null": "null",
}


def make_validator(schema: dict[str, Any]) -> Draft202012Validator:
    """A compiled validator for one tool (built once at registration, reused for every call)."""
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def make_fast_check(schema: dict[str, Any]) -> Callable[[Any], Any] | None:
    """A yes/no check compiled to Python code (fastjsonschema), ~20× faster than jsonschema
    on the valid calls that are the common case; jsonschema still words the errors. ``None``
    when the schema uses something the compiler does not support."""
    try:
        return fastjsonschema.compile(schema, use_default=False, use_formats=False)  # type: ignore[no-any-return]
    except Exception:
        return None


def argument_errors(validator: Draft202012Validator, arguments: dict[str, Any]) -> list[str]:
    """Every problem with ``arguments``, worded for the model; an empty list means valid."""
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    return [message for error in errors for message in _describe(error)]


def _where(error: ValidationError) -> str:
    path = ".".join(str(part) for part in error.absolute_path)
    return f"'{path}'" if path else "arguments"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(error: ValidationError) -> Iterable[str]:
    where = _where(error)
    kind = error.validator
    if kind == "required":
        prefix = "" if where == "arguments" else f"{where[1:-1]}."
        for name in error.validator_value:
            if isinstance(error.instance, dict) and name not in error.instance:
                yield f"missing required argument '{prefix}{name}'"
    elif kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        prefix = "" if where == "arguments" else f"{where[1:-1]}."
        extras = [k for k in error.instance if k not in error.schema.get("properties", {})]
        hint = f" (allowed: {', '.join(allowed)})" if allowed else " (this tool takes none)"
        for name in extras:
            yield f"unknown argument '{prefix}{name}'{hint}"
    elif kind == "enum":
        options = ", ".join(str(option) for option in error.validator_value)
        yield f"{where} must be one of: {options}"
    elif kind == "const":
        yield f"{where} must be {_short(error.validator_value)}"
    elif kind == "type":
        expected = error.validator_value
        names = expected if isinstance(expected, list) else [expected]
        wanted = " or ".join(_TYPE_WORDS.get(str(n), str(n)) for n in names)
        yield f"{where} must be {wanted}, got {_short(error.instance)}"
    else:
        yield f"{where}: {error.message}"
