"""Tool arguments → a list of errors a model can act on.

jsonschema does the checking; this module only words its findings the way a model (or a person
reading a trace) needs them: which argument, what was wrong, what is allowed. Each message names
the argument so a small model can fix exactly that one.

Formats are checked too, for the four a tool's arguments most often carry (``FORMATS``):
``date-time`` (an ISO 8601 date and time; the offset may be left out, as Python's ``datetime``
allows), ``date``, ``email`` and ``uri`` (absolute, with a scheme). Other formats are
annotations only, as JSON Schema has it by default.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

import fastjsonschema
from jsonschema import Draft202012Validator, FormatChecker
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
_FORMAT_WORDS = {
    "date-time": "a date and time in ISO 8601 (2024-06-15T15:20:00+08:00)",
    "date": "a date as YYYY-MM-DD (2024-06-15)",
    "email": "an email address (name@example.com)",
    "uri": "an absolute URI with a scheme (https://example.com/page)",
}


_DATE_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}:\d{2})?"
)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_EMAIL = re.compile(r"[^@\s]+@[^@\s.]+(\.[^@\s.]+)+")
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[^\s]+")


def is_date_time(value: str) -> bool:
    """An ISO 8601 date and time: ``2024-06-15T15:20:00Z``, ``2024-06-15T15:20:00+08:00``,
    ``2024-06-15 15:20`` (no offset: a naive time, as ``datetime`` takes it)."""
    if not _DATE_TIME.fullmatch(value):
        return False
    try:
        dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:  # the 31st of February, hour 25
        return False
    return True


def is_date(value: str) -> bool:
    """A calendar date, ``YYYY-MM-DD``."""
    if not _DATE.fullmatch(value):
        return False
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def is_email(value: str) -> bool:
    """``local@domain.tld``: one ``@``, a dotted domain, no spaces (what an address looks
    like, not whether it exists)."""
    return _EMAIL.fullmatch(value) is not None


def is_uri(value: str) -> bool:
    """An absolute URI: a scheme, a colon, and no spaces (``https://example.com/a``,
    ``mailto:a@b.cn``)."""
    return _URI.fullmatch(value) is not None


FORMATS: dict[str, Callable[[str], bool]] = {
    "date-time": is_date_time,
    "date": is_date,
    "email": is_email,
    "uri": is_uri,
}
"""The formats argument validation checks, each a test of a string."""

FORMAT_CHECKER = FormatChecker(formats=())
for _name, _check in FORMATS.items():
    # jsonschema hands a checker every instance; a format applies to strings only.
    FORMAT_CHECKER.checks(_name)(
        lambda value, check=_check: not isinstance(value, str) or check(value)
    )


def make_validator(schema: dict[str, Any]) -> Draft202012Validator:
    """A compiled validator for one tool (built once at registration, reused for every call)."""
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=FORMAT_CHECKER)


def make_fast_check(schema: dict[str, Any]) -> Callable[[Any], Any] | None:
    """A yes/no check compiled to Python code (fastjsonschema), ~20× faster than jsonschema
    on the valid calls that are the common case; jsonschema still words the errors. ``None``
    when the schema uses something the compiler does not support.

    The fast check gets the same format tests as jsonschema (``FORMATS``), so that what it
    passes jsonschema passes too; a format only it knows (``ipv4``...) can make it refuse a
    valid call, which then goes to jsonschema and passes there."""
    try:
        return fastjsonschema.compile(  # type: ignore[no-any-return]
            schema, use_default=False, use_formats=True, formats=dict(FORMATS)
        )
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
    elif kind == "format":
        wanted = _FORMAT_WORDS.get(str(error.validator_value), f"a {error.validator_value}")
        yield f"{where} must be {wanted}, got {_short(error.instance)}"
    elif kind == "type":
        expected = error.validator_value
        names = expected if isinstance(expected, list) else [expected]
        wanted = " or ".join(_TYPE_WORDS.get(str(n), str(n)) for n in names)
        yield f"{where} must be {wanted}, got {_short(error.instance)}"
    else:
        yield f"{where}: {error.message}"


def non_finite_errors(arguments: Any) -> list[str]:
    """One message per NaN or infinite number in ``arguments``, however deeply it sits.

    JSON has no such numbers, but Python's ``json`` reads ``NaN``, ``Infinity`` and ``1e999``
    as them, and a NaN passes every ``minimum`` and ``maximum`` (each comparison with it is
    false): refused here, whatever the schema says. A walk with its own stack, as arguments a
    hook changed may nest deeper than the decoders allow."""
    found: list[str] = []
    # A path is (key, parent's path), spelled out only for a finding: linear however deep.
    stack: list[tuple[Any, Any]] = [(None, arguments)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            keys: list[str] = []
            while path is not None:
                keys.append(path[0])
                path = path[1]
            where = f"'{'.'.join(reversed(keys))}'" if keys else "arguments"
            found.append(f"{where} must be a finite number, got {_short(value)}")
        elif isinstance(value, dict):
            stack.extend(((str(k), path), v) for k, v in reversed(value.items()))
        elif isinstance(value, list | tuple):
            stack.extend(((str(n), path), v) for n, v in reversed(list(enumerate(value))))
    return found
