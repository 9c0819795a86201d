"""One ``<tool_call>`` block → tool calls or parse errors: the lenient decoding.

``parse_block`` reads the text that the scanner (``protocol.parser``) found between a block's
tags; ``decode_value`` reads one value the same way. Nothing here knows about streams or
tags other than a block's own content.

What a block may hold (lenient in what it accepts):

- ``{"name": ..., "arguments": {...}}`` with the keys in any order, with or without newlines
  around it; ``"parameters"`` instead of ``"arguments"``; an OpenAI-shaped
  ``{"type": "function", "function": {"name": ..., "arguments": ...}}``.
- ``arguments`` as an object, or double-encoded as a JSON string; missing, ``null`` or ``""``
  means ``{}``.
- A JSON list of calls (its commas between objects may be missing), or several objects one
  after another, in one tag.
- Qwen3-Coder's XML: ``<function=NAME><parameter=KEY>VALUE</parameter></function>`` (one or
  more functions; missing closing tags tolerated). Values are text, marked
  ``ToolCall.text_arguments``; the ToolSelector types them from the tool's schema.
- In a ``<tools>`` block, a tool definition echoed from the prompt (a ``description``, or a
  JSON Schema as ``parameters``) is an error, never a call.
- Code fences (```` ```json ... ``` ````) around the JSON.
- Python-style dicts: single quotes, ``True``/``False``/``None``, tuples (read with
  ``ast.literal_eval``, never ``eval``); trailing commas.
- An ``"id"`` is kept; otherwise the call gets a fresh id from ``new_id``.

Exact in what it reports: every block that cannot be turned into calls becomes one
``ParseError(block, message)`` whose message says what was wrong in words a model can act on.
A ``NaN``, ``Infinity`` or a number too large for a float (``1e999``), which Python's readers
take, makes its block an error: no call carries a number JSON cannot say. It never raises on
any text: a block nested deeper than ``MAX_NESTING`` levels (``[ { (`` outside strings, JSON or
Python style, double-encoded arguments included) is an error "nested too deeply (max depth
64)", checked before any decoder recurses, and so is a number too long to convert.

Example::

    >>> [call] = parse_block("{'name': 'add', 'arguments': {'a': 1,}}", lambda: "c1")
    >>> call.name, call.arguments, call.id
    ('add', {'a': 1}, 'c1')
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import re
import warnings
from collections.abc import Callable
from typing import Any, Final

from hermes_agent.errors import HermesAgentError
from hermes_agent.types import ParseError, ToolCall

__all__ = [
    "FUNCTION_OPEN",
    "IN_STRING_STOP",
    "MAX_NESTING",
    "SPECIAL_TOKENS",
    "WHITESPACE",
    "NonFiniteNumber",
    "decode_value",
    "loads_finite",
    "parse_block",
    "strip_special_suffix",
    "too_deep",
]

SPECIAL_TOKENS: Final = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|eom_id|>",
)
"""End-of-turn tokens that a server may leave in the text; they never reach ``content``."""

WHITESPACE: Final = " \t\r\n"
# The JSON string rules, shared with the scanner: inside a string opened by this quote, the
# characters that may end it (the quote) or escape the next one (a backslash).
IN_STRING_STOP: Final = {'"': re.compile(r'[\\"]'), "'": re.compile(r"[\\']")}


class NonFiniteNumber(HermesAgentError, ValueError):
    """A ``NaN``, ``Infinity`` or a number too large for a float (``1e999``): Python's readers
    take them, JSON has no such numbers, and every bound compares false with NaN."""

    def __init__(self, written: str) -> None:
        super().__init__(f"{written} is not a finite number (JSON has no NaN or Infinity)")


def _no_constant(written: str) -> Any:
    raise NonFiniteNumber(written)


def _finite_float(written: str) -> float:
    value = float(written)
    if not math.isfinite(value):
        raise NonFiniteNumber(written)
    return value


# strict=False lets raw newlines and tabs stand inside strings, as models often write them.
# No call holds a non-finite number: refused here, it never reaches a tool, the trail or the
# service's JSON (which cannot say it either).
_DECODER: Final = json.JSONDecoder(
    strict=False, parse_constant=_no_constant, parse_float=_finite_float
)
_STRICT_DECODER: Final = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def loads_finite(text: str) -> Any:
    """``json.loads`` that refuses ``NaN``, ``Infinity`` and ``1e999`` (``NonFiniteNumber``),
    for arguments read outside a ``<tool_call>`` block (an endpoint's native ``tool_calls``)."""
    return _STRICT_DECODER.decode(text)


MAX_NESTING: Final = 64
"""Deepest nesting of ``[ { (`` a block may hold; deeper blocks are a ``ParseError``.

Real tool calls nest a few levels. The decoders recurse once per level, so without a fixed cap
a deep block would parse or fail depending on how deep the caller's stack already is; 64 also
leaves every later stage (validation, copies, serialisation) far from Python's recursion limit.
"""
_TOO_DEEP: Final = f"nested too deeply (max depth {MAX_NESTING})"
# What too_deep drops: quoted strings (a string that never closes runs to the end) and
# runs of anything but brackets. What is left of a text is its brackets, in order.
_NOT_NESTING: Final = re.compile(
    "|".join(
        (
            r'"[^"\\]*(?:\\.[^"\\]*)*"?',
            r"'[^'\\]*(?:\\.[^'\\]*)*'?",
            r"""[^"'\[\]{}()]+""",
        )
    ),
    re.DOTALL,
)
_NESTING_STEP: Final = {"[": 1, "{": 1, "(": 1, "]": -1, "}": -1, ")": -1}

_HINT: Final = 'write {"name": ..., "arguments": {...}}'
_XML_HINT: Final = "write <function=NAME><parameter=KEY>VALUE</parameter></function>"


def strip_special_suffix(text: str) -> str:
    """``text`` without trailing blanks and the special tokens among them."""
    text = text.rstrip()
    while text.endswith(SPECIAL_TOKENS):
        text = next(text[: -len(t)] for t in SPECIAL_TOKENS if text.endswith(t)).rstrip()
    return text


# --- one block → calls or errors ---------------------------------------------------------


class _InvalidJSON(ValueError):
    """Text that neither JSON nor the small repairs could read; the message says why."""


def parse_block(
    block: str, new_id: Callable[[], str], *, listing: bool = False
) -> list[ToolCall | ParseError]:
    """Everything one ``<tool_call>`` block holds, in order; at least one entry.

    ``listing``: the block was opened by ``<tools>``, where a model may also echo the tool
    definitions of its prompt; those are refused, never run with their schema as arguments.
    """
    text = _strip_fence(strip_special_suffix(block).strip())
    if not text:
        return [ParseError(block, f"empty <tool_call>: {_HINT} between the tags")]
    if text.startswith(FUNCTION_OPEN):
        return _xml_calls(text, block, new_id)
    try:
        value = _loads_lenient(text)
        if isinstance(value, str):  # the whole call double-encoded as a JSON string
            value = _loads_lenient(value)
    except _InvalidJSON as exc:
        return [ParseError(block, f"invalid JSON in <tool_call>: {exc}; {_HINT}")]
    if not isinstance(value, list):
        return [_call_from(value, block, new_id, where="", listing=listing)]
    if not value:
        return [ParseError(block, f"<tool_call> holds an empty list; {_HINT}")]
    return [
        _call_from(
            item, block, new_id, where=f"item {n} of the list in <tool_call>: ", listing=listing
        )
        for n, item in enumerate(value, 1)
    ]


def _call_from(
    item: Any, block: str, new_id: Callable[[], str], where: str, *, listing: bool = False
) -> ToolCall | ParseError:
    if not isinstance(item, dict):
        return ParseError(block, f"{where}expected a JSON object, got {_kind(item)}; {_HINT}")
    function = item.get("function")
    source: dict[str, Any] = function if isinstance(function, dict) else item  # OpenAI shape
    if listing and _is_definition(source):
        return ParseError(
            block,
            f"{where}<tools> holds a tool definition, not a call; to call a tool write "
            '<tool_call>{"name": ..., "arguments": {...}}</tool_call>',
        )
    name = source.get("name")
    if name is None:
        return ParseError(block, f'{where}tool call has no "name"; {_HINT}')
    if not isinstance(name, str) or not name.strip():
        return ParseError(block, f'{where}"name" must be a non-empty string, got {name!r}; {_HINT}')
    raw = source["arguments"] if "arguments" in source else source.get("parameters")
    arguments = _arguments(raw)
    if isinstance(arguments, str):
        return ParseError(block, f"{where}{arguments}")
    call_id = item.get("id")
    if not (isinstance(call_id, str) and call_id):
        call_id = new_id()
    return ToolCall(name=name.strip(), arguments=arguments, id=call_id)


def _is_definition(source: dict[str, Any]) -> bool:
    """A tool definition as the prompt lists them: a description, or a JSON Schema for
    ``parameters``. A call has neither."""
    if "description" in source:
        return True
    schema = source.get("parameters")
    return isinstance(schema, dict) and schema.get("type") == "object" and "properties" in schema


# --- Qwen3-Coder XML calls ---------------------------------------------------------------

FUNCTION_OPEN: Final = "<function="
_FUNCTION_CLOSE: Final = "</function>"
_PARAMETER_OPEN: Final = "<parameter="
_PARAMETER_CLOSE: Final = "</parameter>"
# One regex for the four tags, so each search moves forward: linear however many parameters.
_XML_TAG: Final = re.compile("<function=|</function>|<parameter=|</parameter>")
# A name runs to its '>': blanks inside it are part of it (a JSON Schema property may hold
# them), a line break or another tag is not.
_XML_NAME: Final = re.compile(r"[^\s<>](?:[^<>\n]*[^\s<>])?")
# A value that never met its </parameter> may end in a closing marker that drifted
# ("</parameter1>", "</parameter_x>", a bare "</parameter"): the model's close, not its text.
_DRIFTED_CLOSE: Final = re.compile(r"\n?</parameter[^\s<>]*>?\Z")


class _InvalidXML(ValueError):
    """The XML form of a block is broken; the message says where."""


def _xml_calls(text: str, block: str, new_id: Callable[[], str]) -> list[ToolCall | ParseError]:
    """``<function=NAME><parameter=KEY>VALUE</parameter>...</function>``, one or more.

    Lenient about missing closing tags (a parameter also ends at the next tag, a function at
    the next ``<function=`` or the end of the block); anything but blanks outside the elements
    makes the block one error. Values stay text (``ToolCall.text_arguments``): only the tool's
    schema knows whether ``3`` is a number or a string. One newline right after the opening
    tag and one right before the closing tag are the layout the Qwen3-Coder template writes,
    and are dropped; other blanks belong to the value.
    """
    results: list[ToolCall | ParseError] = []
    pos = 0
    try:
        while (found := _XML_TAG.search(text, pos)) is not None:
            _blank_or_fail(text, pos, found.start(), "between the functions")
            if found.group() != FUNCTION_OPEN:
                raise _InvalidXML(f"{found.group()} outside a <function=...>")
            name, pos = _xml_name(text, found.end(), "function")
            arguments, problem, pos = _xml_parameters(text, pos)
            if problem is not None:
                results.append(ParseError(block, f"invalid XML call to {name!r}: {problem}"))
            else:
                results.append(ToolCall(name, arguments, new_id(), text_arguments=True))
        _blank_or_fail(text, pos, len(text), "after the last function")
    except _InvalidXML as exc:
        return [ParseError(block, f"invalid XML call in <tool_call>: {exc}; {_XML_HINT}")]
    return results


def _xml_parameters(text: str, pos: int) -> tuple[dict[str, str], str | None, int]:
    """The parameters of one function from ``pos``; (arguments, problem, where it ended)."""
    arguments: dict[str, str] = {}
    problem = None
    while True:
        found = _XML_TAG.search(text, pos)
        end = len(text) if found is None else found.start()
        _blank_or_fail(text, pos, end, "between the parameters")
        if found is None:
            return arguments, problem, end  # an unclosed function ends with the block
        tag = found.group()
        if tag == _FUNCTION_CLOSE:
            return arguments, problem, found.end()
        if tag == FUNCTION_OPEN:
            return arguments, problem, found.start()  # a forgotten </function>
        if tag == _PARAMETER_CLOSE:
            raise _InvalidXML("</parameter> without its <parameter=...>")
        key, start = _xml_name(text, found.end(), "parameter")
        after = _XML_TAG.search(text, start)
        stop = len(text) if after is None else after.start()
        value = text[start:stop]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        closed = after is not None and after.group() == _PARAMETER_CLOSE
        if not closed and "</parameter" in value:
            value = _DRIFTED_CLOSE.sub("", value)
        if key in arguments and problem is None:
            problem = f"parameter {key!r} is given twice; give each parameter once"
        arguments[key] = value
        pos = after.end() if closed and after is not None else stop


def _xml_name(text: str, pos: int, what: str) -> tuple[str, int]:
    """The name in ``<function=NAME>`` / ``<parameter=NAME>`` from ``pos``, and what follows."""
    close = text.find(">", pos)
    name = text[pos:close].strip() if close >= 0 else ""
    if close < 0 or not _XML_NAME.fullmatch(name):
        shown = text[pos : pos + 40]
        raise _InvalidXML(f"<{what}= must be followed by a name and '>', got {shown!r}")
    return name, close + 1


def _blank_or_fail(text: str, start: int, end: int, where: str) -> None:
    if text[start:end].strip():
        stray = text[start:end].strip()
        shown = stray if len(stray) <= 40 else stray[:40] + "…"
        raise _InvalidXML(f"unexpected text {shown!r} {where}")


def _arguments(value: Any) -> dict[str, Any] | str:
    """The arguments as a dict, or a message saying what is wrong with them."""
    # Decode at most twice: models sometimes encode the arguments string once more.
    for _ in range(2):
        if value is None or (isinstance(value, str) and not value.strip()):
            return {}
        if not isinstance(value, str):
            break
        try:
            value = _loads_lenient(value)
        except _InvalidJSON as exc:
            return (
                f'"arguments" is a string that is not valid JSON ({exc}); '
                'pass an object: "arguments": {...}'
            )
    if isinstance(value, dict):
        return value
    return f'"arguments" must be a JSON object, got {_kind(value)}; {_HINT}'


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return type(value).__name__


_FENCE_LANGUAGE: Final = re.compile(r"[A-Za-z0-9_+.-]*")


def _strip_fence(text: str) -> str:
    """Text inside a Markdown code fence (with or without a language); an unclosed one too."""
    if not text.startswith("```"):
        return text
    language = _FENCE_LANGUAGE.match(text, 3)
    text = text[language.end() if language else 3 :].strip()
    if text.endswith("```"):
        text = text[:-3]
    return text.strip()


def decode_value(text: str) -> Any:
    """One value written as text, read as leniently as a ``<tool_call>`` block: JSON, then
    trailing and missing commas repaired, then a Python-style literal (single quotes,
    ``True``/``None``). Raises ``ValueError`` with a message a model can act on. The
    ToolSelector types the text values of XML calls with it."""
    try:
        return _loads_lenient(text.strip())
    except _InvalidJSON as exc:
        raise ValueError(str(exc)) from None


def _loads_lenient(text: str) -> Any:
    """JSON, then a few explicit repairs; raises ``_InvalidJSON`` with JSON's own complaint."""
    if too_deep(text):
        raise _InvalidJSON(_TOO_DEEP)
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        first = exc
    except NonFiniteNumber as exc:
        raise _InvalidJSON(str(exc)) from None
    except RecursionError:  # a caller that is itself deep in the stack
        raise _InvalidJSON(_TOO_DEEP) from None
    except ValueError as exc:  # not a syntax error: int() refused a number with too many digits
        raise _InvalidJSON(
            f"a number is too long ({_first_clause(exc)}); send it as a string"
        ) from None
    except MemoryError:
        raise _InvalidJSON("too large to read") from None
    repaired = _map_outside_strings(text, _repair_commas)
    for attempt in (_json_sequence, _python_literal):
        try:
            return attempt(repaired)
        except NonFiniteNumber as exc:  # read this way, but holding NaN or Infinity
            raise _InvalidJSON(str(exc)) from None
        except Exception:
            # Untrusted text through a best-effort repair: any failure (ast.literal_eval alone
            # has six kinds) only means "not this way"; JSON's complaint is the one reported.
            continue
    where = "char" if first.msg.endswith(" at") else "at char"  # "Unterminated string starting at"
    raise _InvalidJSON(f"{first.msg} {where} {first.pos}") from None


def too_deep(text: str) -> bool:
    """Whether ``[ { (`` nest deeper than ``MAX_NESTING`` outside quoted strings in ``text``.

    Exact for JSON and for Python literals without comments. Where it is off (broken text, a
    ``#`` comment holding a quote) the decoders' own limits still stop the descent, and their
    errors are caught. Linear, and nearly free for the usual text with few brackets.
    """
    if text.count("[") + text.count("{") + text.count("(") <= MAX_NESTING:
        return False
    brackets = _NOT_NESTING.sub("", text)
    depths = itertools.accumulate(map(_NESTING_STEP.__getitem__, brackets))
    return max(depths, default=0) > MAX_NESTING


def _first_clause(exc: BaseException) -> str:
    """The part of an exception's message before any advice meant for programmers."""
    return str(exc).split(";", 1)[0]


def _json_sequence(text: str) -> Any:
    """JSON with trailing commas removed; several values in a row become a list."""
    values: list[Any] = []
    pos = 0
    while True:
        value, pos = _DECODER.raw_decode(text, pos)
        values.append(value)
        # Between values: only blanks and at most one comma.
        while pos < len(text) and text[pos] in WHITESPACE:
            pos += 1
        if pos < len(text) and text[pos] == ",":
            pos += 1
            while pos < len(text) and text[pos] in WHITESPACE:
                pos += 1
        if pos == len(text):
            return values[0] if len(values) == 1 else values


def _python_literal(text: str) -> Any:
    """A Python-style literal (single quotes, True/None, tuples) as plain JSON values."""
    source = _map_outside_strings(text, _json_words_to_python)
    with warnings.catch_warnings():
        # Model output such as '\d' would make the compiler warn about escapes on every call.
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return _jsonable(ast.literal_eval(source))


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):  # 1e999 is a Python literal too
        raise NonFiniteNumber(repr(value))
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v) for k, v in value.items()}
    raise ValueError(f"{type(value).__name__} is not a JSON value")


_ANY_QUOTE: Final = re.compile(r"[\"']")
_TRAILING_COMMA: Final = re.compile(r",(\s*[}\]])")
_MISSING_COMMA: Final = re.compile(r"\}(\s*)\{")
_JSON_WORD: Final = re.compile(r"\b(true|false|null)\b")
_PYTHON_WORDS: Final = {"true": "True", "false": "False", "null": "None"}


def _map_outside_strings(text: str, repair: Callable[[str], str]) -> str:
    """Apply ``repair`` to the parts of ``text`` outside quoted strings, so values stay intact.

    One forward pass (a regex that retried every quote would be quadratic on broken input);
    a string that never closes runs to the end.
    """
    out: list[str] = []
    done = 0
    while (opening := _ANY_QUOTE.search(text, done)) is not None:
        start = opening.start()
        end = _string_end(text, start + 1, text[start])
        out.append(repair(text[done:start]))
        out.append(text[start:end])
        done = end
    out.append(repair(text[done:]))
    return "".join(out)


def _string_end(text: str, pos: int, quote: str) -> int:
    """Index just past the quote that closes a string whose body starts at ``pos``."""
    stop = IN_STRING_STOP[quote]
    while (found := stop.search(text, pos)) is not None:
        if text[found.start()] == quote:
            return found.end()
        pos = found.start() + 2  # a backslash escapes the next character
    return len(text)


def _repair_commas(code: str) -> str:
    """Drop trailing commas, and add the comma between two objects that lack one (a list of
    calls written as ``[{...} {...}]``; valid JSON never has ``}`` then ``{`` without one)."""
    return _MISSING_COMMA.sub(r"},\1{", _TRAILING_COMMA.sub(r"\1", code))


def _json_words_to_python(code: str) -> str:
    return _JSON_WORD.sub(lambda m: _PYTHON_WORDS[m.group()], code)
