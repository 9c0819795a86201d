"""Structured output: what ``output_type`` asks of the final answer, and the check of it.

``agent.run(message, output_type=Invoice)`` (a pydantic model, or any type pydantic can
validate) or ``output_type={...}`` (a JSON Schema) makes the final answer a JSON value that must
validate: ``RunResult.data`` is then the instance (a ``dict`` for a JSON Schema).

How the model is held to it:

- the schema goes into the system prompt, in the Hermes JSON-mode form (``<schema>...</schema>``;
  ``protocol.prompts.json_mode_prompt``), for every model;
- a model that constrains decoding gets it in ``ModelSettings.output_schema`` too: the embedded
  model's grammar then admits only JSON of that schema as a text answer, so the answer is valid
  by construction (up to what a grammar cannot express: ``pattern``, numeric bounds, your own
  validators);
- the ThoughtGenerator checks every text answer here; one that does not validate goes back to
  the model with the errors, and is asked again at most ``max_retries`` times (each retry is a
  step, counted in ``RunResult.output_retries``); after that the run ends with status 422 and
  ``Agent.run`` raises ``OutputValidationError``.

The answer is read leniently — surrounding whitespace, a Markdown code fence, prose before or
after the JSON value — and judged strictly: the value must validate against the schema.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from pydantic import TypeAdapter, ValidationError

from hermes_agent.errors import HermesAgentError
from hermes_agent.tools.validation import CheckTooCostly, SchemaRefused, caller_schema

OutputType = type[Any] | Mapping[str, Any]
"""What ``output_type`` accepts: a pydantic model (or any type pydantic validates), or a JSON
Schema as a mapping."""

MAX_PROBLEMS = 5
"""At most this many validation errors go back to the model (the first ones)."""

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*?)\n?```$", re.S)
_MAX_INLINE_DEPTH = 32


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """A run's ``output_type``, ready to use: the schema the model sees and a validator."""

    schema: dict[str, Any]
    """The JSON Schema as the model sees it (local ``$ref`` inlined, so a grammar can follow)."""
    validate: Callable[[Any], Any]
    """Returns the validated value (an instance for a pydantic type); raises ``ValueError``
    subclasses (``AnswerProblems``) listing what is wrong."""
    name: str
    """The type's name, or the schema's ``title`` (for messages)."""

    def check(self, text: str) -> tuple[Any, list[str]]:
        """``(value, [])`` when ``text`` holds a JSON value that validates; otherwise
        ``(None, problems)`` in words the model can act on."""
        value, problem = read_json(text)
        if problem is not None:
            return None, [problem]
        try:
            return self.validate(value), []
        except AnswerProblems as exc:
            return None, exc.problems

    def dump(self, value: Any) -> str:
        """The validated value as JSON text (``RunResult.output``)."""
        return TypeAdapter(Any).dump_json(value).decode("utf-8")


class AnswerProblems(HermesAgentError, ValueError):
    """What is wrong with an answer, one sentence each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def output_spec(output_type: OutputType) -> OutputSpec:
    """The ``OutputSpec`` of a pydantic type or a JSON Schema; ``HermesAgentError`` when the
    schema itself is invalid or the type cannot be validated by pydantic."""
    if isinstance(output_type, Mapping):
        return _schema_spec(dict(output_type))
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(output_type)
        schema = adapter.json_schema()
    except Exception as exc:
        raise HermesAgentError(
            f"output_type {output_type!r} cannot be used: {type(exc).__name__}: {exc}; "
            "pass a pydantic model (or a type pydantic can validate) or a JSON Schema dict"
        ) from exc

    def validate(value: Any) -> Any:
        try:
            return adapter.validate_python(value)
        except ValidationError as exc:
            raise AnswerProblems(_pydantic_problems(exc)) from None

    name = getattr(output_type, "__name__", None) or str(schema.get("title", "output"))
    return OutputSpec(inline_refs(schema), validate, name)


def _schema_spec(schema: dict[str, Any]) -> OutputSpec:
    problem = schema_budget_problem(schema)
    if problem is not None:  # before anything walks it recursively or expands it
        raise HermesAgentError(problem)
    try:
        # As a caller's schema, whoever wrote it (the service passes its callers' here): its
        # $refs stay inside it, its patterns run on RE2, each check has a step budget.
        compiled = caller_schema(schema)
    except SchemaRefused as exc:
        raise HermesAgentError(f"output_type cannot be used: {exc}; fix the schema") from None

    def validate(value: Any) -> Any:
        try:
            errors = compiled.errors(value)
        except CheckTooCostly as exc:
            why = f"checking the answer against the schema took too long ({exc})"
            raise AnswerProblems([f"{why}; answer with a smaller value"]) from None
        if errors:
            raise AnswerProblems(
                [_schema_problem(e.absolute_path, e.message) for e in errors[:MAX_PROBLEMS]]
            )
        return value

    return OutputSpec(inline_refs(schema), validate, str(schema.get("title", "output")))


def read_json(text: str) -> tuple[Any, str | None]:
    """The JSON value in a model's answer: the whole text, the inside of a code fence, or the
    first object or array in it. ``(None, problem)`` when there is none."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if not body:
        return None, "the answer is empty; answer with the JSON value"
    try:
        return json.loads(body), None
    except json.JSONDecodeError as exc:
        whole_error = exc
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if starts:
        try:
            value, _ = json.JSONDecoder().raw_decode(body, min(starts))
            return value, None
        except json.JSONDecodeError:
            pass
    return None, f"the answer is not valid JSON ({whole_error.msg} at char {whole_error.pos})"


MAX_SCHEMA_DEPTH = 32
"""How deeply an output schema may nest (objects and lists)."""
MAX_SCHEMA_NODES = 5_000
"""How many values an output schema may hold as given."""
MAX_EXPANDED_NODES = 20_000
"""How many it may hold once its local ``$ref`` are inlined (what the prompt and trail get)."""


def schema_budget_problem(schema: Any) -> str | None:
    """Why ``schema`` is too big to use as an output schema, or ``None``: deeper than
    ``MAX_SCHEMA_DEPTH``, more than ``MAX_SCHEMA_NODES`` values, or more than
    ``MAX_EXPANDED_NODES`` once its ``$ref`` are inlined (definitions that refer to each other
    twice at every level double at each level: a 2 KB schema can stand for billions of nodes).
    Linear in the schema's size and never recursive over its nesting, so an attacker's schema
    costs little to refuse."""
    nodes = 0
    refs: set[str] = set()
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if depth > MAX_SCHEMA_DEPTH:
            return (
                f"output_schema nests more than {MAX_SCHEMA_DEPTH} levels deep; "
                "send a flatter schema"
            )
        if nodes > MAX_SCHEMA_NODES:
            return f"output_schema holds more than {MAX_SCHEMA_NODES} values; send a smaller one"
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                refs.add(ref)
            stack.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
    if not isinstance(schema, Mapping):
        return None
    # Every reference resolved where it points (not only into $defs), so that the budget is
    # checked on what a validator will walk.
    definitions = {ref: target for ref in refs if (target := _pointed(schema, ref)) is not _NOWHERE}
    if not definitions:
        return None
    sizes: dict[str, int] = {}
    expanded = _expanded_size(schema, definitions, sizes, ())
    if expanded > MAX_EXPANDED_NODES:
        return (
            f"output_schema expands to more than {MAX_EXPANDED_NODES} values once its $ref "
            "are inlined (definitions that refer to others several times multiply at each "
            "level); send a schema that repeats less"
        )
    return None


_NOWHERE = object()


def _pointed(root: Mapping[str, Any], ref: str) -> Any:
    """What the local ``ref`` (``#``, ``#/a/0/b``) points at in ``root``; ``_NOWHERE``."""
    node: Any = root
    for part in unquote(ref[1:]).split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _NOWHERE
    return node


def _expanded_size(
    node: Any, definitions: dict[str, Any], sizes: dict[str, int], seen: tuple[str, ...]
) -> int:
    """How many values ``node`` holds once inlined as ``_inline`` would (capped just past the
    budget). Walks each definition's own nodes without recursion; recurses only through
    ``$ref``, at most ``_MAX_INLINE_DEPTH`` deep, as ``_inline`` does."""
    cap = MAX_EXPANDED_NODES + 1
    total = 0
    stack = [node]
    while stack and total < cap:
        item = stack.pop()
        total += 1
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, Mapping):
            continue
        ref = item.get("$ref")
        inlined = isinstance(ref, str) and ref in definitions and ref not in seen
        if inlined and len(seen) < _MAX_INLINE_DEPTH:
            assert isinstance(ref, str)
            if ref not in sizes:
                sizes[ref] = _expanded_size(definitions[ref], definitions, sizes, (*seen, ref))
            total += sizes[ref]
        stack.extend(
            value for key, value in item.items() if key not in ("$defs", "definitions", "$ref")
        )
    return min(total, cap)


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its local ``$ref`` (``#/$defs/...``, ``#/definitions/...``) replaced by
    what they point to, so that a grammar or a small model needs no lookups. A recursive
    reference stays a ``$ref`` (a grammar then admits any JSON there)."""
    definitions: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        found = schema.get(key)
        if isinstance(found, Mapping):
            definitions.update({f"#/{key}/{name}": value for name, value in found.items()})
    if not definitions:
        return copy.deepcopy(schema)
    inlined = _inline(schema, definitions, (), [2 * MAX_EXPANDED_NODES])
    assert isinstance(inlined, dict)
    if not _has_ref(inlined):
        inlined.pop("$defs", None)
        inlined.pop("definitions", None)
    return inlined


def _inline(
    node: Any, definitions: dict[str, Any], seen: tuple[str, ...], budget: list[int]
) -> Any:
    # The budget is the last guard (schema_budget_problem refuses such schemas up front):
    # definitions that refer to each other in a ring can still multiply along every path.
    budget[0] -= 1
    if budget[0] < 0:
        raise HermesAgentError(
            f"output_schema expands to more than {MAX_EXPANDED_NODES} values once its $ref are "
            "inlined; send a schema that repeats less"
        )
    if isinstance(node, list):
        return [_inline(item, definitions, seen, budget) for item in node]
    if not isinstance(node, Mapping):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref in definitions:
        if ref in seen or len(seen) >= _MAX_INLINE_DEPTH:
            return dict(node)
        target = _inline(definitions[ref], definitions, (*seen, ref), budget)
        rest = {k: _inline(v, definitions, seen, budget) for k, v in node.items() if k != "$ref"}
        return {**target, **rest} if isinstance(target, dict) else target
    return {
        key: value if key in ("$defs", "definitions") else _inline(value, definitions, seen, budget)
        for key, value in node.items()
    }


def _has_ref(node: Any) -> bool:
    if isinstance(node, list):
        return any(_has_ref(item) for item in node)
    if isinstance(node, Mapping):
        return "$ref" in node or any(
            _has_ref(v) for k, v in node.items() if k not in ("$defs", "definitions")
        )
    return False


def _pydantic_problems(exc: ValidationError) -> list[str]:
    errors = exc.errors(include_url=False)[:MAX_PROBLEMS]
    return [_schema_problem(error["loc"], error["msg"]) for error in errors]


def _schema_problem(path: Any, message: str) -> str:
    where = ".".join(str(part) for part in path)
    return f"'{where}': {message}" if where else message
