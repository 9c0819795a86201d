"""Python signatures → strict JSON Schema for tool parameters.

The schema comes from the type hints (through pydantic, which knows every standard type) and the
parameter descriptions from the docstring (Google, NumPy or reST style, through docstring_parser).
Strict means: every parameter without a default is ``required`` and ``additionalProperties`` is
false, so a model that invents an argument is told so instead of having it silently dropped.

References (``$defs``) are inlined: small models and the GBNF grammar builder both do better with
one self-contained schema per tool. Titles pydantic adds are removed for the same reason.

Every bound a hint declares reaches the schema, and so the validator: ``Field(ge=0)`` as the
default or inside ``Annotated``, ``annotated_types`` (``Ge``, ``Len``...), ``conint`` and the
other ``con*`` types, ``pattern``, ``Literal``, enums.

The way back — JSON arguments → the objects the annotations name (a pydantic model, a dataclass,
a ``datetime``, an ``Enum``, a ``tuple``...) — is ``argument_adapters``: one pydantic
``TypeAdapter`` per parameter whose annotation is more than plain JSON.

What a plain function yields here (its docstring's descriptions, its pydantic arguments model, its
schema) is computed once per function and kept while the function lives, so a service that builds
agents per request from the same functions pays for it once. A function whose docstring,
annotations or defaults are reassigned afterwards is read again.
"""

from __future__ import annotations

import collections.abc
import contextlib
import inspect
import json
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Mapping
from enum import Enum
from typing import (
    Annotated,
    Any,
    Literal,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

import docstring_parser
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model
from pydantic.errors import PydanticInvalidForJsonSchema, PydanticSchemaGenerationError
from pydantic.fields import FieldInfo

from hermes_agent.errors import ToolDefinitionError

_SKIPPED_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


class _FunctionFacts:
    """What was derived from one function, and what it was derived from."""

    __slots__ = ("description", "model", "schema_json", "source")

    def __init__(self, source: tuple[Any, ...]) -> None:
        self.source = source
        self.description: tuple[str, dict[str, str]] | None = None
        self.model: type[BaseModel] | None = None
        self.schema_json: str | None = None


_facts: weakref.WeakKeyDictionary[Callable[..., Any], _FunctionFacts] = weakref.WeakKeyDictionary()
_facts_lock = threading.Lock()


def _source(fn: types.FunctionType) -> tuple[Any, ...]:
    return (
        fn.__code__,
        fn.__doc__,
        fn.__defaults__,
        fn.__kwdefaults__,
        tuple(fn.__annotations__.items()),
    )


def _facts_of(fn: Callable[..., Any]) -> _FunctionFacts | None:
    """The kept facts of a plain function (``None`` for other callables: a bound method is a
    new object at each access, a callable object may change in ways this cannot see)."""
    if type(fn) is not types.FunctionType:
        return None
    source = _source(fn)
    with _facts_lock:
        facts = _facts.get(fn)
        if facts is None or not _same_source(facts.source, source):
            facts = _facts[fn] = _FunctionFacts(source)
    return facts


def _same_source(kept: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    try:  # unchanged parts compare by identity; a reassigned annotation by its own ``==``
        return bool(kept == now)
    except Exception:
        return False


def describe_function(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The docstring's summary (short + long description) and its per-parameter descriptions."""
    facts = _facts_of(fn)
    if facts is not None and facts.description is not None:
        summary, params = facts.description
        return summary, dict(params)
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    summary = "\n\n".join(part for part in (doc.short_description, doc.long_description) if part)
    params = {p.arg_name: p.description or "" for p in doc.params}
    if facts is not None:
        facts.description = (summary, dict(params))
    return summary, params


def arguments_model(fn: Callable[..., Any]) -> type[BaseModel]:
    """A pydantic model of ``fn``'s parameters, used for the schema and for lax coercion."""
    facts = _facts_of(fn)
    if facts is not None and facts.model is not None:
        return facts.model
    model = _arguments_model(fn)
    if facts is not None:
        facts.model = model
    return model


def _arguments_model(fn: Callable[..., Any]) -> type[BaseModel]:
    try:
        # With the extras: the bounds of ``Annotated[float, Field(ge=0)]`` (or ``conint``, or
        # ``annotated_types.Ge``) live in the metadata that plain ``get_type_hints`` drops.
        hints = get_type_hints(fn, include_extras=True)
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
        # A ``Field(5, ge=0)`` default is passed as it is: pydantic reads its bounds and default.
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    try:
        with warnings.catch_warnings():
            # A parameter may well be called ``schema`` or ``json``: on this private model it
            # shadows nothing anyone calls.
            warnings.filterwarnings("ignore", "Field name .* shadows an attribute", UserWarning)
            model: type[BaseModel] = create_model(
                f"{fn.__name__}_arguments",
                __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
                **fields,
            )
    except PydanticSchemaGenerationError as exc:
        raise ToolDefinitionError(_unsupported_hints(fn, fields, exc)) from exc
    return model


_SUPPORTED_HINTS = (
    "str, int, float, bool, None, Literal, an Enum, datetime/date, a list, tuple or dict of "
    "those, a TypedDict, a dataclass or a pydantic model"
)


def _unsupported_hints(fn: Callable[..., Any], fields: Mapping[str, Any], exc: Exception) -> str:
    """Which parameters of a tool have a type the model cannot be asked for, and what to do.

    Pydantic's own message suggests ``arbitrary_types_allowed``, which cannot help a tool: its
    arguments arrive as JSON, and an arbitrary class has no JSON form to ask the model for."""
    bad = []
    for name, (annotation, _) in fields.items():
        try:
            TypeAdapter(annotation).json_schema()
        except Exception:
            bad.append(f"'{name}: {_hint_name(annotation)}'")
    which = ", ".join(bad) if bad else f"a parameter ({exc})"
    return (
        f"tool {fn.__qualname__}: cannot describe {which} to the model: its arguments arrive "
        f"as JSON, so each parameter needs a type with a JSON form ({_SUPPORTED_HINTS}). "
        "Change the annotation, or give the schema yourself with "
        "register_tool(name=, description=, parameters=)"
    )


def _hint_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__qualname__
    return str(annotation).replace("typing.", "")


_JSON_TYPES: frozenset[Any] = frozenset(
    {str, int, float, bool, type(None), None, Any, object, dict, list}
)
"""Annotations whose JSON value is already what the function gets (an int where a ``float`` is
wanted included: Python code treats it as one)."""
_JSON_CONTAINERS: frozenset[Any] = frozenset(
    {
        dict,
        list,
        Union,
        types.UnionType,
        collections.abc.Mapping,
        collections.abc.Sequence,
        collections.abc.Collection,
        collections.abc.Iterable,
    }
)
"""Generic origins that JSON objects and arrays already satisfy when their items do."""


def needs_conversion(annotation: Any, _depth: int = 0) -> bool:
    """Whether a JSON value must be converted to be what ``annotation`` says.

    False for plain JSON (``str``, ``int``, ``float``, ``bool``, ``None``, ``Any``, ``dict``,
    ``list``, ``Literal`` of those, ``TypedDict``, and unions or containers of them); true for
    everything else: pydantic models, dataclasses, enums, tuples, sets, dates, UUIDs...
    """
    try:
        if annotation in _JSON_TYPES:
            return False
    except TypeError:  # unhashable, e.g. Annotated[..., {"a": "dict"}]: look inside below
        pass
    if _depth > 16:  # a self-referencing TypedDict: converting is never wrong, only slower
        return True
    deeper = _depth + 1
    supertype = getattr(annotation, "__supertype__", None)  # typing.NewType
    if supertype is not None:
        return needs_conversion(supertype, deeper)
    if is_typeddict(annotation):
        try:
            hints = get_type_hints(annotation)
        except Exception:  # cannot tell: converting is never wrong, only slower
            return True
        return any(needs_conversion(hint, deeper) for hint in hints.values())
    origin = get_origin(annotation)
    if origin is Annotated:
        return needs_conversion(get_args(annotation)[0], deeper)
    if origin is Literal:
        return any(isinstance(value, Enum) for value in get_args(annotation))
    if origin in _JSON_CONTAINERS:
        return any(needs_conversion(arg, deeper) for arg in get_args(annotation) if arg is not ...)
    return True


def argument_adapters(fn: Callable[..., Any]) -> dict[str, TypeAdapter[Any]]:
    """One ``TypeAdapter`` per parameter of ``fn`` whose annotation needs conversion from JSON,
    or declares constraints of its own (``Annotated[...]`` metadata, a ``Field(...)`` default):
    pydantic checks those again after the schema, so a bound holds even where the schema does
    not carry it (a hand-written ``parameters=``, an ``AfterValidator``).

    Empty when no parameter needs one — or when the annotations cannot be read or adapted (the
    function then gets the JSON values, as its hand-written ``parameters=`` schema describes).
    """
    try:
        hints = get_type_hints(fn, include_extras=True)
        params = inspect.signature(fn).parameters.values()
    except Exception:  # unresolvable names, builtins without a signature
        return {}
    adapters: dict[str, TypeAdapter[Any]] = {}
    for param in params:
        annotation = hints.get(param.name, Any)
        if isinstance(param.default, FieldInfo):
            annotation = Annotated[annotation, param.default]
        if param.kind in _SKIPPED_KINDS or not (
            needs_conversion(annotation) or _constrained(annotation)
        ):
            continue
        try:
            adapters[param.name] = TypeAdapter(annotation)
        except Exception:  # a type pydantic cannot build (only with a hand-written schema)
            continue
    return adapters


def _constrained(annotation: Any) -> bool:
    """Whether ``annotation`` is ``Annotated`` with metadata beyond plain text (a doc string)."""
    if get_origin(annotation) is not Annotated:
        return False
    return any(not isinstance(extra, str) for extra in getattr(annotation, "__metadata__", ()))


def field_defaults(fn: Callable[..., Any]) -> dict[str, FieldInfo]:
    """The parameters of ``fn`` whose Python default is a pydantic ``Field(...)`` that holds a
    default (``x: int = Field(5, ge=0)``): Python would pass the ``FieldInfo`` itself when the
    argument is left out, so the caller fills in the value it stands for (``fill_defaults``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {
        p.name: p.default
        for p in params
        if isinstance(p.default, FieldInfo) and not p.default.is_required()
    }


def fill_defaults(defaults: Mapping[str, FieldInfo], arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` with each left-out parameter of ``defaults`` set to its field's default."""
    missing = [name for name in defaults if name not in arguments]
    if not missing:
        return arguments
    filled = dict(arguments)
    for name in missing:
        filled[name] = defaults[name].get_default(call_default_factory=True)
    return filled


def convert_arguments(
    adapters: Mapping[str, TypeAdapter[Any]], arguments: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """``arguments`` (JSON, already valid against the schema) with every parameter that has an
    adapter converted; and the problems, one per failed check, worded like schema errors.

    Values are validated as JSON (``validate_json``), so strict models accept what their JSON
    form allows (an ISO string for a ``datetime``, an array for a ``tuple``).
    """
    converted = dict(arguments)
    problems: list[str] = []
    for name, adapter in adapters.items():
        if name not in arguments:
            continue  # left to the function's default
        try:
            converted[name] = adapter.validate_json(json.dumps(arguments[name]))
        except ValidationError as exc:
            problems.extend(_conversion_problems(name, exc))
        except (TypeError, ValueError) as exc:  # not JSON data (a hook put an object there)
            problems.append(f"'{name}': {exc}")
    return converted, problems


def _conversion_problems(name: str, exc: ValidationError) -> list[str]:
    found = []
    for error in exc.errors(include_url=False):
        path = ".".join(str(part) for part in (name, *error["loc"]))
        found.append(f"'{path}': {error['msg']}")
    return found


def schema_from_function(fn: Callable[..., Any]) -> dict[str, Any]:
    """The strict JSON Schema of ``fn``'s parameters, with docstring descriptions (a new dict
    at each call: the caller may change it)."""
    facts = _facts_of(fn)
    if facts is not None and facts.schema_json is not None:
        schema: dict[str, Any] = json.loads(facts.schema_json)
        return schema
    schema = _schema_from_function(fn)
    if facts is not None:
        with contextlib.suppress(TypeError, ValueError):  # a default JSON cannot carry
            facts.schema_json = json.dumps(schema)
    return schema


def _schema_from_function(fn: Callable[..., Any]) -> dict[str, Any]:
    model = arguments_model(fn)  # its own ToolDefinitionError names the parameter
    try:
        raw = model.model_json_schema()
    except PydanticInvalidForJsonSchema as exc:
        # A type pydantic validates but cannot describe (a Callable, say).
        fields = {
            name: (field.annotation, field.default) for name, field in model.model_fields.items()
        }
        raise ToolDefinitionError(_unsupported_hints(fn, fields, exc)) from exc
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


def schema_from_model(model: type[BaseModel]) -> dict[str, Any]:
    """A pydantic model's fields as a tool's parameters: its JSON Schema (references inlined,
    titles dropped), strict at the top level whatever the model's own config says."""
    try:
        raw = model.model_json_schema()
    except Exception as exc:
        raise ToolDefinitionError(
            f"cannot build a JSON schema from {model.__qualname__}: {exc}. "
            "Use JSON-compatible field types or pass parameters= as a JSON Schema dict."
        ) from exc
    schema = _clean(_inline_refs(raw, raw.get("$defs", {})))
    return strict_object(schema.get("properties", {}), schema.get("required", []))


WRAPPED_NAME = "schema"
"""The parameter name that marks a function taking all its arguments as one pydantic model
(``def get_stock(schema: StockRequest)``): the model's fields are the tool's arguments."""


def model_parameter(
    fn: Callable[..., Any], given: type[BaseModel] | None = None
) -> tuple[str, type[BaseModel]] | None:
    """``(name, model)`` when ``fn`` takes its arguments as one pydantic model: its only
    parameter is annotated with ``given`` (the ``parameters=`` of the tool), or, without one,
    is named ``schema`` and annotated with a pydantic model. ``None`` otherwise: the arguments
    are the function's parameters, one by one."""
    try:
        params = [
            p for p in inspect.signature(fn).parameters.values() if p.kind not in _SKIPPED_KINDS
        ]
        hints = get_type_hints(fn) if len(params) == 1 else {}
    except Exception:  # no signature, unresolvable hints: the plain way
        return None
    if len(params) != 1:
        return None
    name = params[0].name
    annotation: Any = hints.get(name)
    if given is not None:
        return (name, given) if annotation is given else None
    if name == WRAPPED_NAME and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        model: type[BaseModel] = annotation
        return name, model
    return None


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
        and not (isinstance(p.default, FieldInfo) and p.default.is_required())
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
