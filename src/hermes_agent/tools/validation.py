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
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import unquote

import fastjsonschema
import re2  # type: ignore[import-untyped]
import referencing
import referencing.exceptions
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import SchemaError, ValidationError, best_match

from hermes_agent.errors import HermesAgentError

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
    """A compiled validator for one tool (built once at registration, reused for every call).
    A ``$ref`` must point into the schema itself (``SchemaError`` otherwise): nothing is
    fetched, for a tool author's schema as for an MCP server's."""
    Draft202012Validator.check_schema(schema)
    problem = reference_problem(schema)
    if problem is not None:
        raise SchemaError(problem)
    return Draft202012Validator(schema, format_checker=FORMAT_CHECKER, registry=LOCAL_ONLY)


def make_fast_check(schema: dict[str, Any]) -> Callable[[Any], Any] | None:
    """A yes/no check compiled to Python code (fastjsonschema), ~20× faster than jsonschema
    on the valid calls that are the common case; jsonschema still words the errors. ``None``
    when the schema uses something the compiler does not support.

    The fast check gets the same format tests as jsonschema (``FORMATS``), so that what it
    passes jsonschema passes too; a format only it knows (``ipv4``...) can make it refuse a
    valid call, which then goes to jsonschema and passes there.

    fastjsonschema fetches, with ``urllib``, any ``$ref`` its ``$id``/``id`` scope makes
    remote: a schema with a reference outside itself or an id anywhere gets no fast check."""
    if reference_problem(schema) is not None or _declares_id(schema):
        return None
    try:
        return fastjsonschema.compile(
            schema, use_default=False, use_formats=True, formats=dict(FORMATS)
        )
    except Exception:
        return None


def argument_errors(validator: Draft202012Validator, arguments: dict[str, Any]) -> list[str]:
    """Every problem with ``arguments``, worded for the model; an empty list means valid."""
    try:
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    except referencing.exceptions.Unresolvable as exc:  # e.g. under an $id naming a URL
        return [f"the tool's schema cannot be used: {exc} (references are never fetched)"]
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


# -- references: resolved in the schema itself, never fetched -------------------------------


def _refuse_retrieval(uri: str) -> referencing.Resource[Any]:
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


LOCAL_ONLY: referencing.Registry[Any] = referencing.Registry(
    retrieve=_refuse_retrieval  # type: ignore[call-arg]
)
"""Where every validator here looks a ``$ref`` up: the schema itself (and JSON Schema's own
metaschemas). jsonschema's default would fetch any other URL, or read a ``file://`` one."""


def reference_problem(schema: Any) -> str | None:
    """Why ``schema`` would need another document, or ``None``: a ``$ref`` that is not a
    fragment of this one (``#...``), or a ``$dynamicRef``/``$recursiveRef`` (resolved against
    whichever schema is in scope as it runs). Every value is looked at, not only the keywords,
    because a reference may point anywhere in the document."""
    pending: list[Any] = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
            continue
        if not isinstance(node, Mapping):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return (
                f"$ref {_short(ref)} names another document: references are resolved within "
                "the schema only (nothing is fetched); put the definition under $defs and "
                "point at it with '#/$defs/...'"
            )
        for keyword in ("$dynamicRef", "$recursiveRef"):
            if isinstance(node.get(keyword), str):
                return f"{keyword} is not supported; use $ref to a definition under $defs"
        pending.extend(node.values())
    return None


def _declares_id(schema: Any) -> bool:
    pending: list[Any] = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
        elif isinstance(node, Mapping):
            if isinstance(node.get("$id"), str) or isinstance(node.get("id"), str):
                return True
            pending.extend(node.values())
    return False


# -- a schema from outside: compiled on its own terms ---------------------------------------
#
# A caller's schema (an output schema, a response_format, a client tool's parameters) is
# checked with jsonschema, but: its ``$ref``s point at its own subschemas only; its patterns run
# on RE2, whose matching time is linear in the text (Python's ``re`` backtracks: ``^(a+)+$``
# against thirty ``a`` and a ``!`` takes minutes); and every check has a budget of keyword
# evaluations (``MAX_CHECK_STEPS``), since definitions that refer to each other twice at each
# level still multiply along a deep enough value.

MAX_CHECK_STEPS = 100_000
"""How many keyword evaluations one check of a value against a caller's schema may take
(about half a second of one core at worst; a sensible schema and value need a few thousand)."""

MAX_PATTERNS = 64
"""How many regular expressions (``pattern``, ``patternProperties`` names) a caller's schema may
hold: compiling one costs up to a few milliseconds, and a schema is compiled as it arrives."""

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is our answer, not a line on stderr
# RE2's default is 8 MB a pattern; 1 MB still takes any field-sized pattern, and gives up on a
# huge one (``[\p{L}]{1,1000}``) after ~4 ms instead of ~40.
_RE2_OPTIONS.max_mem = 1 << 20


class SchemaRefused(HermesAgentError, ValueError):
    """A caller's schema that cannot be compiled: the message says why and what to do."""


class CheckTooCostly(HermesAgentError, ValueError):
    """A check against a caller's schema went over its budget (``MAX_CHECK_STEPS``)."""


@lru_cache(maxsize=256)
def linear_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (linear-time matching); ``re2.error`` when RE2 cannot run it
    (backreferences, lookaround). Kept for reuse, 256 at most: each may hold up to its 1 MB."""
    return re2.compile(pattern, _RE2_OPTIONS)


def pattern_problem(pattern: str) -> str | None:
    """Why RE2 cannot run ``pattern``, or ``None``."""
    try:
        linear_pattern(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        return (
            f"pattern {_short(pattern)} cannot run on a linear-time engine ({reason}): "
            "write a simpler one (RE2 takes no backreferences or lookaround)"
        )
    return None


_steps_left: ContextVar[list[int] | None] = ContextVar("hermes_check_steps", default=None)


def _counted(check: Callable[..., Any]) -> Callable[..., Any]:
    """``check`` (a jsonschema keyword) counted against the running check's budget."""

    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        left = _steps_left.get()
        if left is not None:
            left[0] -= 1
            if left[0] < 0:
                raise CheckTooCostly(f"more than {MAX_CHECK_STEPS} steps")
        return check(validator, value, instance, schema)

    return keyword


def _matches(pattern: Any, text: str) -> bool:
    return isinstance(pattern, str) and linear_pattern(pattern).search(text) is not None


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _matches(pattern, instance):
        yield ValidationError(f"{_short(instance)} does not match {_short(pattern)}")


def _pattern_properties(
    validator: Any, patterns: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object") or not isinstance(patterns, Mapping):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if _matches(pattern, name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        name
        for name in instance
        if name not in named and not any(_matches(pattern, name) for pattern in patterns)
    ]
    if validator.is_type(allowed, "object"):
        for name in extras:
            yield from validator.descend(instance[name], allowed, path=name)
    elif allowed is False and extras:
        listed = ", ".join(repr(name) for name in sorted(extras))
        yield ValidationError(f"additional properties are not allowed ({listed})")


def _identity(value: Any) -> Any:
    """A hashable stand-in for a JSON value, equal where JSON Schema says two values are
    (``1`` and ``1.0`` are, ``true`` and ``1`` are not)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(_identity(item) for item in value))
    if isinstance(value, Mapping):
        return ("object", frozenset((key, _identity(item)) for key, item in value.items()))
    return ("other", id(value))


def _unique_items(
    validator: Any, unique: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    # jsonschema compares every pair of unhashable items: quadratic in the array's length.
    if unique is not True or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = _identity(item)
        if key in seen:
            yield ValidationError(f"{_short(instance)} has non-unique elements")
            return
        seen.add(key)


_OWN_KEYWORDS: dict[str, Callable[..., Any]] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
}
_CallerValidator: Any = validators.extend(
    Draft202012Validator,
    {
        name: _counted(_OWN_KEYWORDS.get(name, check))
        for name, check in Draft202012Validator.VALIDATORS.items()
    },
)
_METASCHEMA = Draft202012Validator(Draft202012Validator.META_SCHEMA, registry=LOCAL_ONLY)

_ONE_SCHEMA = (
    "additionalProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "items",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contentSchema",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
)


def _pointer_part(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def untrusted_schema_problem(schema: Any) -> str | None:
    """Why a caller's ``schema`` cannot be compiled, or ``None``. The schema is read the way
    a validator reads it — from the root through the keywords that hold subschemas — so what is
    checked here is exactly what can ever be applied:

    - a ``$ref`` points at one of those subschemas (``#``, ``#/$defs/...``,
      ``#/properties/...``), never into a member that is no keyword, nor another document;
      ``$dynamicRef``/``$recursiveRef``, and ``$id``/``$schema`` below the root, are refused;
    - every ``pattern`` and ``patternProperties`` name compiles on RE2, and there are at most
      ``MAX_PATTERNS`` of them;
    - ``unevaluatedProperties`` is not combined with ``patternProperties`` (jsonschema matches
      those with Python's ``re`` when it works out what was evaluated).

    Call it after the size budgets (``pipeline.structured.schema_budget_problem``): it visits
    each subschema once."""
    if not isinstance(schema, Mapping):
        return None
    found: set[str] = set()
    refs: list[Any] = []
    unevaluated = patterned = False
    patterns = 0
    pending: list[tuple[str, Any]] = [("", schema)]
    while pending:
        pointer, node = pending.pop()
        if not isinstance(node, Mapping):
            continue
        found.add(pointer)
        for keyword in ("$dynamicRef", "$recursiveRef"):
            if keyword in node:
                return f"{keyword} is not supported; use $ref to a definition under $defs"
        for keyword in ("$id", "$schema"):
            if pointer and keyword in node:
                return f"{keyword} is accepted at the top of the schema only (at {pointer})"
        if "$ref" in node:
            refs.append(node["$ref"])
        found_here = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        named = node.get("patternProperties")
        if isinstance(named, Mapping):
            patterned = True
            found_here.extend(str(name) for name in named)
        patterns += len(found_here)
        if patterns > MAX_PATTERNS:
            return f"more than {MAX_PATTERNS} patterns; describe the others in 'description'"
        for pattern in found_here:
            if problem := pattern_problem(pattern):
                return problem
        unevaluated = unevaluated or "unevaluatedProperties" in node
        for keyword in _ONE_SCHEMA:
            if isinstance(node.get(keyword), Mapping):
                pending.append((f"{pointer}/{keyword}", node[keyword]))
        for keyword in _SCHEMA_LISTS:
            if isinstance(node.get(keyword), list):
                pending.extend((f"{pointer}/{keyword}/{n}", s) for n, s in enumerate(node[keyword]))
        for keyword in _SCHEMA_MAPS:
            if isinstance(node.get(keyword), Mapping):
                pending.extend(
                    (f"{pointer}/{keyword}/{_pointer_part(str(name))}", sub)
                    for name, sub in node[keyword].items()
                )
    for ref in refs:
        if not isinstance(ref, str):
            return f"$ref must be a string, got {_short(ref)}"
        if not ref.startswith("#"):
            return reference_problem({"$ref": ref})
        if unquote(ref[1:]) not in found:
            return (
                f"$ref {_short(ref)} does not point at a subschema of this schema: point it at "
                "a definition under $defs (or at '#', properties, items...), not at a member "
                "that is no keyword"
            )
    if unevaluated and patterned:
        return "unevaluatedProperties cannot be combined with patternProperties here"
    return None


@dataclass(frozen=True, slots=True)
class CallerSchema:
    """A caller's schema, compiled (``caller_schema``): check values with ``errors``."""

    validator: Any

    def errors(self, instance: Any, max_steps: int = MAX_CHECK_STEPS) -> list[ValidationError]:
        """Every way ``instance`` fails the schema, in order of where; ``CheckTooCostly`` when
        finding out takes more than ``max_steps`` keyword evaluations (or nests deeper than
        Python's recursion allows)."""
        token = _steps_left.set([max_steps])
        try:
            found = list(self.validator.iter_errors(instance))
        except RecursionError:
            raise CheckTooCostly("the value nests too deeply") from None
        finally:
            _steps_left.reset(token)
        return sorted(found, key=lambda e: [str(part) for part in e.absolute_path])


def caller_schema(schema: Mapping[str, Any], *, formats: bool = False) -> CallerSchema:
    """``schema`` compiled for checking values (``formats``: check ``FORMATS`` too, as for a
    tool's arguments); ``SchemaRefused`` saying why it cannot be. Compiled once per distinct
    schema (and kept for the next request that sends it)."""
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        raise SchemaRefused("the schema is not JSON") from None
    return _compiled_caller_schema(key, formats)


@lru_cache(maxsize=64)  # a few requests' worth: callers send their schema with every request
def _compiled_caller_schema(key: str, formats: bool) -> CallerSchema:
    schema = json.loads(key)
    problem = untrusted_schema_problem(schema)
    if problem is not None:
        raise SchemaRefused(problem)
    error = best_match(_METASCHEMA.iter_errors(schema))
    if error is not None:
        raise SchemaRefused(f"not a valid JSON Schema: {error.message}")
    if isinstance(schema, dict):
        # Identification only: without them every '#...' resolves in this document, and no
        # subschema switches to another draft's validator (which would match with 're').
        schema = {k: v for k, v in schema.items() if k not in ("$id", "$schema")}
    checker = FORMAT_CHECKER if formats else None
    return CallerSchema(_CallerValidator(schema, format_checker=checker, registry=LOCAL_ONLY))


def caller_argument_errors(schema: Mapping[str, Any], arguments: Any) -> list[str]:
    """Every problem with a client tool's ``arguments`` against the caller's ``schema``,
    worded for the model, within the check's budget; an empty list means valid."""
    try:
        compiled = caller_schema(schema, formats=True)
    except SchemaRefused as exc:
        return [f"the tool's schema cannot be used: {exc}"]
    return compiled_argument_errors(compiled, arguments)


def compiled_argument_errors(compiled: CallerSchema, arguments: Any) -> list[str]:
    """``caller_argument_errors`` for a schema compiled already (``caller_schema`` with
    ``formats``): what a tool holding its compiled outside schema checks with."""
    try:
        errors = compiled.errors(arguments)
    except CheckTooCostly as exc:
        return [
            f"checking the arguments against the tool's schema took too long ({exc}); "
            "send simpler arguments"
        ]
    return [message for error in errors for message in _describe(error)]
