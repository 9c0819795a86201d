r"""Tool schemas → a GBNF grammar that only admits "plain text" or "valid tool calls".

An embedded model decodes under this grammar (llama.cpp's GBNF dialect), so every tool call it
writes is well-formed JSON, names a known tool and carries arguments that match that tool's
parameters schema — valid by construction — while answering in plain text stays possible.
This module is pure text generation: it does not import llama.cpp and does no I/O.

The language, for ``tool_choice="auto"`` (rule names as they appear in the output)::

    root        ::= text | calls
    text        ::= text-start text-char{0,N-1}          # plain prose; N = max_text_chars
    calls       ::= scratch-pad? call ("\n" call){0,M-1}  # M = max_calls
    scratch-pad ::= "<scratch_pad>\n" text-char{1,N} "\n</scratch_pad>\n"   # if scratch_pad
    call        ::= "<tool_call>\n" (call-<tool> | call-<other-tool> | ...) "\n</tool_call>"
    call-<tool> ::= "{\"name\":" sp "\"<tool>\"" "," sp "\"arguments\":" sp <arguments> "}"
    sp          ::= " "?

``tool_choice`` picks the branch: ``"auto"`` → ``text | calls``; ``"required"`` → ``calls``;
``"none"`` → ``text``; the name of a tool → ``calls`` whose ``call`` admits only that tool.
Without tools, ``"auto"`` and ``"none"`` need no constraint and ``build_grammar`` returns
``None`` (plain chat is left alone: the grammar costs sampling time and forbids tags in prose).
With tools and ``"none"`` the text-only grammar is still returned, because the conversation may
already hold ``<tool_call>`` blocks that a small model would happily imitate.

Plain text may not start with ``<`` or with whitespace, and nowhere contains a ``<`` that could
open a tag (``<`` followed by a letter, ``/``, ``!`` or another ``<``; a ``<`` cannot end the
text either). A text answer therefore never starts a ``<tool_call>`` or ``<scratch_pad>`` the
parser would pick up, and the structured branch is the only way to a call. Its length is bounded
so that the language is finite: a looping model reaches a grammatical end even when the caller's
``max_tokens`` is large. ``"x < 3"`` is still fine prose; ``"<b>"`` is not.

Arguments come from a small JSON Schema → GBNF converter (``_SchemaConverter``):

- ``object`` with ``properties``: the declared properties in declaration order, required ones
  always present, optional ones optional, nothing else (``additionalProperties`` is treated as
  false). An object without properties (and not closed by ``additionalProperties: false``) is a
  generic bounded JSON object.
- ``string``: JSON's own character set (no raw control characters, escapes allowed), length
  ``minLength``..``min(maxLength, max_string_chars)`` counting an escape as one character.
  ``pattern`` and ``format`` are not enforced (argument validation after parsing still checks
  them).
- ``integer`` / ``number`` (at most 16 integer digits; no minus sign when ``minimum >= 0``;
  other bounds are not enforced), ``boolean``, ``null``, ``enum``, ``const`` (as JSON literals),
  ``array`` (``items``, ``minItems``..``min(maxItems, max_items)``; ``uniqueItems`` not
  enforced), ``anyOf`` / ``oneOf`` (as alternatives; ``oneOf`` exclusivity is not enforced),
  type lists such as ``["string", "null"]`` and ``nullable: true``.
- Anything else (``$ref``, ``allOf`` with several members, ``not``, ``if``, ...) falls back to a
  generic JSON value of bounded depth, size and string length.

Whitespace is tight: nothing after ``{``/``[`` or before ``}``/``]``, and no or one space after
``:`` and ``,``. Free whitespace is where a tiny model runs away.

Rule names are GBNF identifiers (letters, digits, ``-``); tool names are sanitised for rule
names (``math.factorial`` → ``call-math-factorial``) while the literal name in the call stays
exact.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["build_grammar", "tool_name", "tool_parameters"]

_MAX_INT_DIGITS = 16
_MAX_FRACTION_DIGITS = 15
_GENERIC_DEPTH = 3

# A JSON string character: anything but '"', '\' and control characters, or an escape.
_STRING_CHAR = r'[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'
# A prose character: a '<' only when what follows cannot open a tag.
_TEXT_CHAR = r'[^<] | "<" [^a-zA-Z/!<]'
_TEXT_START = r'[^< \t\r\n] | "<" [^a-zA-Z/!< \t\r\n]'


def tool_name(tool: Mapping[str, Any]) -> str:
    """The name of an OpenAI-format tool dict (``{"type": "function", "function": {...}}``).

    A bare ``{"name": ..., "parameters": ...}`` dict is accepted too.
    """
    function = tool.get("function", tool)
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool has no name: {tool!r}")
    return name


def tool_parameters(tool: Mapping[str, Any]) -> Any:
    """The parameters schema of an OpenAI-format tool dict; no ``parameters`` means no arguments."""
    function = tool.get("function", tool)
    params = function.get("parameters") if isinstance(function, Mapping) else None
    if params is None:
        return {"type": "object", "properties": {}, "additionalProperties": False}
    return params


def build_grammar(
    tools: Sequence[Mapping[str, Any]],
    *,
    tool_choice: str = "auto",
    scratch_pad: bool = False,
    max_calls: int = 4,
    max_string_chars: int = 256,
    max_items: int = 8,
    max_text_chars: int = 2048,
    answer_schema: Mapping[str, Any] | None = None,
) -> str | None:
    """A GBNF grammar for the next assistant turn, or ``None`` when nothing needs constraining.

    ``tools`` are OpenAI-format tool dicts. ``tool_choice`` is ``"auto"`` (plain text or calls),
    ``"required"`` (one to ``max_calls`` calls), ``"none"`` (plain text only) or the name of the
    one tool that must be called. ``scratch_pad`` admits one ``<scratch_pad>`` block before the
    calls. ``max_string_chars`` bounds every JSON string, ``max_items`` every array and generic
    object, ``max_text_chars`` plain text and the scratch pad.

    ``answer_schema`` (structured output) replaces plain text: the text branch then admits
    only JSON matching that schema (through the same converter as the arguments), so a text
    answer is valid by construction; with no tools the answer is all the grammar admits.

    Returns ``None`` when ``tools`` is empty, ``tool_choice`` is ``"auto"`` or ``"none"`` and
    there is no ``answer_schema``.
    Raises ``ValueError`` when a call is required but cannot be made (no tools, unknown name).

    >>> tools = [{"type": "function", "function": {"name": "ping", "parameters": {
    ...     "type": "object", "properties": {}, "additionalProperties": False}}}]
    >>> print(build_grammar(tools, tool_choice="required").splitlines()[0])
    root ::= calls
    """
    if max_calls < 1 or max_string_chars < 1 or max_items < 1 or max_text_chars < 1:
        raise ValueError("max_calls, max_string_chars, max_items and max_text_chars must be >= 1")
    names = [tool_name(tool) for tool in tools]
    if tool_choice in ("auto", "none") and not tools:
        if answer_schema is None:
            return None
        tool_choice = "none"  # nothing to call: the answer is the only branch
    if tool_choice == "required" and not tools:
        raise ValueError('tool_choice="required" needs at least one tool')
    if tool_choice not in ("auto", "none", "required") and tool_choice not in names:
        known = ", ".join(names) or "none"
        raise ValueError(f"tool_choice names an unknown tool {tool_choice!r} (known: {known})")

    g = _SchemaConverter(max_string_chars=max_string_chars, max_items=max_items)
    if tool_choice == "none":
        root = "text"
    elif tool_choice == "auto":
        root = "text | calls"
    else:
        root = "calls"
    g.define("root", root)

    if tool_choice in ("none", "auto"):
        rest = f" text-char{_bounds(0, max_text_chars - 1)}" if max_text_chars > 1 else ""
        if answer_schema is not None:
            g.define("text", g.value(answer_schema, "answer"))
        else:
            g.define("text", "text-start" + rest)
            g.define("text-start", _TEXT_START)
            g.define("text-char", _TEXT_CHAR)
    if tool_choice != "none":
        chosen = [
            tool
            for tool, name in zip(tools, names, strict=True)
            if tool_choice in ("auto", "required") or name == tool_choice
        ]
        call_rules = [_call_rule(g, tool) for tool in chosen]
        more = f' ("\\n" call){_bounds(0, max_calls - 1)}' if max_calls > 1 else ""
        g.define("calls", ("scratch-pad? " if scratch_pad else "") + "call" + more)
        alternatives = " | ".join(dict.fromkeys(call_rules))  # a tool listed twice: once
        g.define("call", '"<tool_call>\\n" (' + alternatives + ') "\\n</tool_call>"')
        if scratch_pad:
            g.define(
                "scratch-pad",
                f'"<scratch_pad>\\n" text-char{_bounds(1, max_text_chars)} "\\n</scratch_pad>\\n"',
            )
            g.define("text-char", _TEXT_CHAR)
    return g.render()


def _call_rule(g: _SchemaConverter, tool: Mapping[str, Any]) -> str:
    name = tool_name(tool)
    hint = "call-" + name
    args = g.value(tool_parameters(tool), hint + "-args")
    body = (
        '"{\\"name\\":" sp '
        + _literal(json.dumps(name, ensure_ascii=False))
        + ' "," sp "\\"arguments\\":" sp '
        + args
        + ' "}"'
    )
    return g.add(hint, body)


def _bounds(lo: int, hi: int) -> str:
    """GBNF repetition suffix for ``lo..hi`` occurrences (``hi >= lo``)."""
    if lo == hi:
        return "" if lo == 1 else f"{{{lo}}}"
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo},{hi}}}"


def _literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _json_literal(value: Any) -> str:
    return _literal(json.dumps(value, ensure_ascii=False))


class _SchemaConverter:
    """Collects GBNF rules while walking JSON Schemas; identical bodies share one rule."""

    def __init__(self, *, max_string_chars: int, max_items: int) -> None:
        self.max_string_chars = max_string_chars
        self.max_items = max_items
        self._rules: dict[str, str] = {}
        self._by_body: dict[str, str] = {}

    # -- rule bookkeeping ------------------------------------------------------------------

    def define(self, name: str, body: str) -> None:
        """Define a fixed-name rule (idempotent for the same body)."""
        existing = self._rules.get(name)
        if existing is not None and existing != body:
            raise AssertionError(f"rule {name} defined twice")
        self._rules[name] = body

    def add(self, hint: str, body: str) -> str:
        """Add a rule named after ``hint`` (sanitised, made unique) and return its name."""
        if body in self._by_body:
            return self._by_body[body]
        base = re.sub(r"[^a-zA-Z0-9]+", "-", hint).strip("-").lower() or "rule"
        name, n = base, 1
        while name in self._rules:
            n += 1
            name = f"{base}-{n}"
        self._rules[name] = body
        self._by_body[body] = name
        return name

    def render(self) -> str:
        self._rules.setdefault("sp", '" "?')
        return "".join(f"{name} ::= {body}\n" for name, body in self._rules.items())

    # -- schemas ----------------------------------------------------------------------------

    def value(self, schema: Any, hint: str) -> str:
        """A GBNF expression (usually a rule name) for values matching ``schema``."""
        if schema is True or schema == {}:
            return self.generic(_GENERIC_DEPTH)
        if not isinstance(schema, Mapping):
            return self.generic(_GENERIC_DEPTH)
        if "const" in schema:
            return _json_literal(schema["const"])
        if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
            return self.add(hint, " | ".join(_json_literal(v) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                alts = [self.value(sub, f"{hint}-{i}") for i, sub in enumerate(options)]
                return self._alternatives(hint, alts, nullable=bool(schema.get("nullable")))
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1 and len(schema) == 1:
            return self.value(all_of[0], hint)
        if any(k in schema for k in ("$ref", "allOf", "not", "if")):
            return self.generic(_GENERIC_DEPTH)

        types = schema.get("type")
        if types is None:
            if "properties" in schema:
                types = ["object"]
            elif "items" in schema:
                types = ["array"]
            else:
                return self.generic(_GENERIC_DEPTH)
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not types:
            return self.generic(_GENERIC_DEPTH)
        alts = [self._typed(schema, t, f"{hint}-{t}" if len(types) > 1 else hint) for t in types]
        return self._alternatives(hint, alts, nullable=bool(schema.get("nullable")))

    def _alternatives(self, hint: str, alts: list[str], *, nullable: bool) -> str:
        if nullable and '"null"' not in alts:
            alts = [*alts, '"null"']
        unique = list(dict.fromkeys(alts))
        return unique[0] if len(unique) == 1 else self.add(hint, " | ".join(unique))

    def _typed(self, schema: Mapping[str, Any], kind: Any, hint: str) -> str:
        if kind == "object":
            return self._object(schema, hint)
        if kind == "array":
            return self._array(schema, hint)
        if kind == "string":
            return self.string(
                _int(schema.get("minLength"), 0), _int(schema.get("maxLength"), None)
            )
        if kind == "integer":
            return self._number(integer=True, unsigned=_non_negative(schema))
        if kind == "number":
            return self._number(integer=False, unsigned=_non_negative(schema))
        if kind == "boolean":
            return self.add("boolean", '"true" | "false"')
        if kind == "null":
            return '"null"'
        return self.generic(_GENERIC_DEPTH)

    def _object(self, schema: Mapping[str, Any], hint: str) -> str:
        props = schema.get("properties")
        if not isinstance(props, Mapping):
            props = {}
        if not props and schema.get("additionalProperties") is not False:
            return self.generic_object(_GENERIC_DEPTH)
        required = set(schema.get("required") or ())
        members = [
            (
                _literal(json.dumps(key, ensure_ascii=False) + ":")
                + " sp "
                + self.value(sub, f"{hint}-{key}"),
                key in required,
            )
            for key, sub in props.items()
        ]
        inner = _members(members)
        return self.add(hint, f'"{{" {inner} "}}"' if inner else '"{" "}"')

    def _array(self, schema: Mapping[str, Any], hint: str) -> str:
        item = self.value(schema.get("items", True), hint + "-item")
        lo = _int(schema.get("minItems"), 0) or 0
        hi = _int(schema.get("maxItems"), None)
        hi = self.max_items if hi is None else min(hi, self.max_items)
        hi = max(hi, lo)
        return self.add(hint, _sequence('"["', item, lo, hi, '"]"'))

    def string(self, lo: int | None = 0, hi: int | None = None) -> str:
        """The rule for a JSON string of ``lo``..``hi`` characters (``hi`` capped)."""
        lo = lo or 0
        hi = self.max_string_chars if hi is None else min(hi, self.max_string_chars)
        hi = max(hi, lo)
        self.define("char", _STRING_CHAR)
        name = "string" if (lo, hi) == (0, self.max_string_chars) else f"string-{lo}-{hi}"
        self.define(name, f'"\\"" char{_bounds(lo, hi)} "\\""' if hi else '"\\"\\""')
        return name

    def _number(self, *, integer: bool, unsigned: bool) -> str:
        digits = f'("0" | [1-9] [0-9]{_bounds(0, _MAX_INT_DIGITS - 1)})'
        body = ("" if unsigned else '"-"? ') + digits
        if not integer:
            body += f' ("." [0-9]{_bounds(1, _MAX_FRACTION_DIGITS)})? ([eE] [-+]? [0-9]{{1,3}})?'
        name = ("unsigned-" if unsigned else "") + ("integer" if integer else "number")
        self.define(name, body)
        return name

    def generic(self, depth: int) -> str:
        """Any JSON value, nested at most ``depth`` levels, bounded in size."""
        scalars = [
            self.string(),
            self._number(integer=False, unsigned=False),
            self.add("boolean", '"true" | "false"'),
            '"null"',
        ]
        if depth <= 0:
            return self.add("value-0", " | ".join(scalars))
        alts = [*scalars, self.generic_object(depth), self._generic_array(depth)]
        return self.add(f"value-{depth}", " | ".join(alts))

    def generic_object(self, depth: int) -> str:
        """Any JSON object whose values nest at most ``depth - 1`` levels."""
        member = f'{self.string()} ":" sp {self.generic(depth - 1)}'  # key: value
        return self.add(
            f"object-{depth}", _sequence('"{"', f"({member})", 0, self.max_items, '"}"')
        )

    def _generic_array(self, depth: int) -> str:
        return self.add(
            f"array-{depth}", _sequence('"["', self.generic(depth - 1), 0, self.max_items, '"]"')
        )


def _sequence(open_: str, item: str, lo: int, hi: int, close: str) -> str:
    """``open item ("," sp item)... close`` with ``lo``..``hi`` items."""
    if hi == 0:
        return f"{open_} {close}"
    rest = f' ("," sp {item}){_bounds(max(lo - 1, 0), hi - 1)}' if hi > 1 else ""
    inner = f"{item}{rest}"
    if lo == 0:
        inner = f"({inner})?"
    return f"{open_} {inner} {close}"


def _members(members: list[tuple[str, bool]]) -> str:
    """Object members in a fixed order; required ones always present, optional ones optional.

    The first member written has no leading comma, so the body is a choice of which member comes
    first: any optional member before the first required one, or the first required one itself
    (or, with no required members, nothing at all).
    """
    if not members:
        return ""
    first_required = next((i for i, (_, req) in enumerate(members) if req), None)
    last_start = first_required if first_required is not None else len(members) - 1
    alts = []
    for start in range(last_start + 1):
        if start != first_required and members[start][1]:
            continue
        parts = [f"{members[start][0]}"]
        for expr, req in members[start + 1 :]:
            parts.append(f'"," sp {expr}' if req else f'("," sp {expr})?')
        alts.append(" ".join(parts))
    body = " | ".join(f"({a})" if len(alts) > 1 else a for a in alts)
    if first_required is None:
        return f"({body})?"
    return f"({body})" if len(alts) > 1 else body


def _int(value: Any, default: int | None) -> int | None:
    return (
        value
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0
        else (default)
    )


def _non_negative(schema: Mapping[str, Any]) -> bool:
    for key in ("minimum", "exclusiveMinimum"):
        bound = schema.get(key)
        if isinstance(bound, int | float) and not isinstance(bound, bool) and bound >= 0:
            return True
    return False
