"""Java and JavaScript cases: how BFCL prompts them, and how the oracle writes their values.

BFCL asks for Java and JavaScript calls with every argument written as *source text* in a
string: the prompt's function docs declare every top-level parameter a ``string`` (the real
type moves into the description: "This is Java HashMap type parameter in string
representation."), and BFCL's checker reads the strings back with its own type converters
(``java_type_converter``, ``js_type_converter``) against the *original* docs before comparing
them with the possible answers. ``prompt_functions`` does the first step as BFCL does it; the
checker does the second (``bfcl_compat``); ``source_value`` is the oracle's inverse: a value
written as the source text BFCL's converter reads back as that value.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

PYTHON = "python"
JAVA = "java"
JAVASCRIPT = "javascript"

HINTS = {
    PYTHON: " Note that the provided function is in Python 3 syntax.",
    JAVA: " Note that the provided function is in Java 8 SDK syntax.",
    JAVASCRIPT: " Note that the provided function is in JavaScript syntax.",
}
"""What BFCL appends to every function description before prompting, per language."""

_LANGUAGE_NAMES = {JAVA: "Java", JAVASCRIPT: "JavaScript"}
_AS_STRING = " in string representation"
_LIST_TYPES = {JAVA: ("ArrayList", "Array"), JAVASCRIPT: ("array",)}

Converter = Callable[..., Any]
"""BFCL's ``java_type_converter`` / ``js_type_converter``: (text, type, nested type) → value."""


def language_of(category: str) -> str:
    """The language of a BFCL category (``simple_java`` → ``java``; the rest are Python)."""
    if "javascript" in category:
        return JAVASCRIPT
    if "java" in category:
        return JAVA
    return PYTHON


def prompt_functions(functions: Sequence[Mapping[str, Any]], language: str) -> list[dict[str, Any]]:
    """The function docs as BFCL puts them in the prompt: the language hint appended to each
    description and, for Java and JavaScript, every top-level parameter turned into a string
    whose description names its real type (list item types and object fields go into the
    description too). The input is left untouched."""
    prompted = copy.deepcopy([dict(function) for function in functions])
    for function in prompted:
        function["description"] = function.get("description", "") + HINTS[language]
        if language == PYTHON:
            continue
        name = _LANGUAGE_NAMES[language]
        properties = function.get("parameters", {}).get("properties", {})
        for parameter in properties.values():
            kind = parameter.get("type")
            text = parameter.get("description", "")
            if kind == "any":
                text += f" This parameter can be of any type of {name} object{_AS_STRING}."
            else:
                text += f" This is {name} {kind} type parameter{_AS_STRING}."
            if kind in _LIST_TYPES[language]:
                item_type = parameter.get("items", {}).get("type")
                text += f" The list elements are of type {item_type}; they are not{_AS_STRING}."
                parameter.pop("items", None)
            if language == JAVASCRIPT and kind == "dict" and "properties" in parameter:
                fields = json.dumps(parameter.pop("properties"))
                text += (
                    " The dictionary entries have the following schema; they are not"
                    f"{_AS_STRING}. {fields}"
                )
            parameter["description"] = text
            parameter["type"] = "string"
    return prompted


# -- the oracle's side: values → source text ---------------------------------------------------

_JAVA_ARRAY_TYPES = {
    "integer": "int",
    "long": "long",
    "short": "short",
    "byte": "byte",
    "double": "double",
    "float": "float",
    "boolean": "boolean",
    "char": "char",
    "String": "String",
}


def source_value(
    value: Any, parameter: Mapping[str, Any], language: str, convert: Converter
) -> str:
    """``value`` written as ``language`` source text that ``convert`` (BFCL's converter for the
    language) reads back, for the parameter's original BFCL type, as an equal value.

    Several spellings are tried in turn (a string bare or quoted, a list as an array literal or
    an ``ArrayList``); the first that reads back equal wins, else the first spelling.
    """
    kind = str(parameter.get("type", "any"))
    item_type = (
        parameter.get("items", {}).get("type")
        if isinstance(parameter.get("items"), Mapping)
        else None
    )
    spellings = _java(value, kind, item_type) if language == JAVA else _javascript(value, kind)
    for text in spellings:
        try:
            back = convert(text, kind, item_type) if item_type else convert(text, kind)
        except Exception:  # BFCL's converters raise on odd input: try the next spelling
            continue
        if _same(back, value):
            return text
    return spellings[0]


def _same(left: Any, right: Any) -> bool:
    if isinstance(left, bool) or isinstance(right, bool):
        return left is right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return math.isclose(left, right)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(
            _same(a, b) for a, b in zip(left, right, strict=True)
        )
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    return bool(left == right)


def _number(value: float) -> str:
    """A float with no exponent (BFCL's JavaScript float pattern has none)."""
    text = repr(float(value))
    if "e" in text or "E" in text:
        text = format(float(value), ".20f").rstrip("0")
        text = text + "0" if text.endswith(".") else text
    return text


def _java_scalar(value: Any, kind: str | None = None) -> str:
    """A Java literal for one element: ``true``, ``12``, ``12L``, ``1.5f``, ``"text"``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}L" if kind == "long" else str(value)
    if isinstance(value, float):
        return f"{value!r}f" if kind == "float" else repr(value)
    return json.dumps(value) if not isinstance(value, str) else f'"{value}"'


def _java(value: Any, kind: str, item_type: str | None) -> list[str]:
    if isinstance(value, bool):
        return ["true" if value else "false", str(value)]
    if isinstance(value, int | float) and kind in ("long", "float"):
        return [_java_scalar(value, kind), str(value)]
    if isinstance(value, int | float):
        return [repr(value), str(value)]
    if isinstance(value, list):
        bare = ", ".join(
            str(item) if item_type in ("String", "char") else _java_scalar(item, item_type)
            for item in value
        )
        quoted = ", ".join(_java_scalar(item, item_type) for item in value)
        element = _JAVA_ARRAY_TYPES.get(str(item_type), "Object")
        boxed = {"int": "Integer", "char": "Character"}.get(element, element.capitalize())
        if kind == "ArrayList":
            return [
                f"new ArrayList<{boxed}>(Arrays.asList({quoted}))",
                f"new ArrayList<>(Arrays.asList({bare}))",
            ]
        return [f"new {element}[]{{{bare}}}", f"new {element}[]{{{quoted}}}"]
    if isinstance(value, dict):
        puts = " ".join(f'put("{key}", {_java_scalar(item)});' for key, item in value.items())
        return [f"new HashMap<String, Object>() {{{{ {puts} }}}}" if puts else "new HashMap<>()"]
    return [str(value)]


def _js_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, list):
        return "[" + ", ".join(_js_scalar(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_js_scalar(item)}" for key, item in value.items()) + "}"
    return f'"{value}"'


def _javascript(value: Any, kind: str) -> list[str]:
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, int) and kind == "Bigint":
        return [f"{value}n", str(value)]
    if isinstance(value, int | float):
        return [_js_scalar(value), str(value)]
    if isinstance(value, list | dict):
        bare = _js_scalar(value)
        return [bare, bare.replace('"', "'")]
    return [str(value), f'"{value}"']
