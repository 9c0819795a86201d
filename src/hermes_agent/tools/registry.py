"""Tools and the registry that holds them.

A ``Tool`` is a Python callable plus what the model must know about it (name, description,
strict JSON Schema of its parameters). Tools are made three ways, all ending in the same object:

    @agent.tool                                  # schema from type hints + docstring
    def add(a: int, b: int) -> int: ...

    @agent.register_tool(name="get_weather", description="...", parameters={"city": {...}})
    def get_weather(city: str) -> dict: ...      # schema given explicitly

    agent.add_tool(Tool.from_function(fn, toolset="finance"))

Every tool belongs to one named toolset ("default" unless said otherwise); an agent or a single
run can be limited to some toolsets.

A parameter annotated with a pydantic model, a dataclass (or anything else JSON does not carry
as such: ``datetime``, ``Enum``, ``tuple``...) gets an instance, not the dict the model wrote:
``Tool.convert`` turns the validated JSON arguments into what the annotations name.

A pydantic model can also stand for all the arguments at once: given as ``parameters=Model``
(its fields are the tool's arguments), or as the one parameter of a function named ``schema``
(``def get_stock(schema: StockRequest)``, the Hermes function-calling convention). The model's
fields are then the arguments the model writes, flat, and a function whose one parameter is
annotated with the model gets an instance of it.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import fastjsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, PydanticSchemaGenerationError, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from hermes_agent.errors import ToolDefinitionError
from hermes_agent.protocol.prompts import openai_tool
from hermes_agent.tools.schema import (
    argument_adapters,
    arguments_model,
    convert_arguments,
    describe_function,
    field_defaults,
    fill_defaults,
    model_parameter,
    schema_from_function,
    schema_from_mapping,
    schema_from_model,
)
from hermes_agent.tools.validation import (
    CallerSchema,
    SchemaRefused,
    argument_errors,
    caller_schema,
    compiled_argument_errors,
    make_fast_check,
    make_validator,
    non_finite_errors,
)

DEFAULT_TOOLSET = "default"
EXECUTION_MODES = ("in_process", "subprocess", "inline")
SETTINGS = (
    "timeout",
    "execution_mode",
    "memory_limit_mb",
    "cpu_time_limit_s",
    "cache_ttl",
    "max_result_chars",
    "requires_approval",
    "fallback",
    "aliases",
    "rate_limit",
    "max_concurrent",
    "toolset",
    "idempotent",
)
"""The per-tool settings a config file may set."""
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


@dataclass(eq=False)
class Tool:
    """A callable the model may call, with its name, description and parameters schema.

    ``timeout`` (seconds) overrides the agent's ``default_timeout``; ``check_fn`` returning
    false marks the tool unavailable for now. The other settings (also settable per tool in
    the YAML ``tools:`` section) shape how the ToolSelector and ToolExecutor treat it:

    - ``execution_mode``: ``in_process`` (default: sync functions run in the agent's thread
      pool), ``subprocess`` (a pooled worker process, killed on timeout, with optional
      ``memory_limit_mb`` and ``cpu_time_limit_s``) or ``inline`` (a sync function called
      right on the event loop: no thread hop, for fast pure functions only — it blocks the
      loop while it runs and its timeout cannot interrupt it);
    - ``cache_ttl``: seconds a result is reused for identical arguments;
    - ``max_result_chars``: longer results are cut, with a note the model sees;
    - ``requires_approval``: the agent's approval callback must allow each call;
    - ``fallback``: the tool to call instead while this one is unavailable;
    - ``aliases``: other names the model may use for it;
    - ``rate_limit``: calls per minute, beyond which calls get a 429 result;
    - ``idempotent``: running a call twice does no harm, so a durable run that lost a call
      mid-way runs it again (otherwise the model is told it was interrupted);
    - ``max_concurrent``: how many calls of a sync ``in_process`` tool may run at once (default:
      half the agent's tool threads); further calls wait their turn within their timeout, so a
      tool that hangs holds at most this many threads.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any]
    toolset: str = DEFAULT_TOOLSET
    timeout: float | None = None
    check_fn: Callable[[], bool] | None = None
    execution_mode: str = "in_process"
    memory_limit_mb: int | None = None
    cpu_time_limit_s: int | None = None
    cache_ttl: float | None = None
    max_result_chars: int | None = None
    requires_approval: bool = False
    fallback: str | None = None
    aliases: list[str] = field(default_factory=list)
    rate_limit: int | None = None
    max_concurrent: int | None = None
    idempotent: bool = False
    parameters_model: type[BaseModel] | None = field(default=None, repr=False)
    """The pydantic model ``parameters`` was made from, when it was (see the module doc)."""
    outside_schema: bool = False
    """``parameters`` came from outside the program (a caller's client tool, an MCP server's
    tool): arguments are checked as against a caller's schema (``validation.caller_schema``:
    patterns on RE2, references within the schema, a step budget), compiled on first use, so
    declaring such a tool costs nothing (whoever takes the schema in compiles it first, off
    the event loop, and refuses what cannot be)."""
    _validator: Draft202012Validator = field(init=False, repr=False)  # unset: outside_schema
    _fast_check: Callable[[Any], Any] | None = field(init=False, repr=False, default=None)
    _outside: CallerSchema | None = field(init=False, repr=False, default=None)
    _coercer: type[BaseModel] | None = field(init=False, repr=False, default=None)
    _adapters: dict[str, TypeAdapter[Any]] | None = field(init=False, repr=False, default=None)
    _defaults: dict[str, FieldInfo] = field(init=False, repr=False, default_factory=dict)
    _is_async: bool = field(init=False, repr=False, default=False)
    _wrapped: tuple[str, type[BaseModel]] | None = field(init=False, repr=False, default=None)
    _spec: dict[str, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ToolDefinitionError(
                f"invalid tool name {self.name!r}: use letters, digits, '_', '.', '-' "
                "(at most 64 characters, not starting with a digit)"
            )
        try:
            if not self.outside_schema:
                self._validator, self._fast_check = _compiled(self.parameters)
        except SchemaError as exc:
            raise ToolDefinitionError(
                f"tool {self.name!r} has an invalid parameters schema: {exc.message}"
            ) from exc
        if self.execution_mode not in EXECUTION_MODES:
            raise ToolDefinitionError(
                f"tool {self.name!r}: execution_mode must be one of {', '.join(EXECUTION_MODES)}, "
                f"got {self.execution_mode!r}"
            )
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ToolDefinitionError(
                f"tool {self.name!r}: max_concurrent must be at least 1, got {self.max_concurrent}"
            )
        self._is_async = inspect.iscoroutinefunction(self.function)
        if self._is_async and self.execution_mode != "in_process":
            raise ToolDefinitionError(
                f"tool {self.name!r}: an async function cannot run in {self.execution_mode} "
                "mode; make it a plain function or use execution_mode: in_process"
            )
        # A function that takes the whole model gets an instance; the model coerces.
        self._wrapped = (
            model_parameter(self.function, self.parameters_model)
            if self.parameters_model is not None
            else None
        )
        self._coercer = (
            self._wrapped[1] if self._wrapped is not None else _coercion_model(self.function)
        )
        self._adapters = None  # built on the first call: defining a tool stays cheap
        self._spec = openai_tool(self.name, self.description, self.parameters)

    @classmethod
    def from_function(
        cls,
        function: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | type[BaseModel] | None = None,
        toolset: str = DEFAULT_TOOLSET,
        timeout: float | None = None,
        check_fn: Callable[[], bool] | None = None,
        **settings: Any,
    ) -> Tool:
        """Build a tool from a function; name, description and schema default to what the
        function's name, docstring and type hints say. ``parameters`` is a JSON Schema (or its
        shorthand, see ``schema_from_mapping``) or a pydantic model whose fields are the
        arguments. ``settings`` are the other fields (``execution_mode``, ``cache_ttl``, ...)."""
        summary, _ = describe_function(function)
        model: type[BaseModel] | None = None
        if isinstance(parameters, type) and issubclass(parameters, BaseModel):
            model = parameters
            schema = schema_from_model(model)
        elif parameters is not None:
            if not isinstance(parameters, Mapping):
                raise ToolDefinitionError(
                    f"tool {name or function.__name__!r}: parameters must be a JSON Schema dict "
                    f"or a pydantic model class, got {type(parameters).__name__}"
                )
            schema = schema_from_mapping(parameters, function)
        elif (wrapped := model_parameter(function)) is not None:
            model = wrapped[1]  # def f(schema: Model): the model's fields, flat
            schema = schema_from_model(model)
        else:
            schema = schema_from_function(function)
        settings.setdefault("parameters_model", model)
        return cls(
            name=name or function.__name__,
            description=description if description is not None else summary,
            parameters=schema,
            function=function,
            toolset=toolset,
            timeout=timeout,
            check_fn=check_fn,
            **settings,
        )

    def configure(self, **settings: Any) -> Tool:
        """Apply per-tool settings (from a config file) in place; unknown names are errors."""
        for key, value in settings.items():
            if key not in SETTINGS:
                raise ToolDefinitionError(
                    f"tool {self.name!r}: unknown setting {key!r} (known: {', '.join(SETTINGS)})"
                )
            setattr(self, key, value)
        self.__post_init__()
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (a decorated tool stays usable in code)."""
        return self.function(*args, **kwargs)

    @property
    def is_async(self) -> bool:
        return self._is_async

    def spec(self) -> dict[str, Any]:
        """The tool in OpenAI function format (what prompts and native APIs carry)."""
        return self._spec

    def available(self) -> bool:
        return self.check_fn is None or bool(self.check_fn())

    def convert(self, arguments: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Valid JSON ``arguments`` → the values the function's annotations name; and the
        problems (a pydantic validator that refused a value), worded for the model.

        Only parameters whose annotation is more than plain JSON are touched (a model, a
        dataclass, ``list[Model]``, ``Model | None``, ``datetime``...); when there are none,
        ``arguments`` come back as they are, at the cost of one check. The ``TypeAdapter``s are
        built on the first call and kept.
        """
        if self._wrapped is not None:
            return self._instance(arguments)
        adapters = self._adapters
        if adapters is None:
            adapters = self._adapters = argument_adapters(self.function)
            self._defaults = field_defaults(self.function)
        if not adapters and not self._defaults:
            return arguments, []
        converted, problems = convert_arguments(adapters, arguments)
        # After converting: a default stands as written, as pydantic leaves defaults unchecked.
        return fill_defaults(self._defaults, converted), problems

    def json_function(self) -> Callable[..., Any]:
        """The function to call with JSON arguments: ``function`` itself when nothing needs
        converting, else a wrapper that converts them first (what a subprocess worker runs,
        since only JSON crosses into it). A value the conversion refuses raises ``ValueError``.
        """
        if self._wrapped is None:
            self.convert({})  # builds the adapters now, so a forked worker inherits them
            if not self._adapters and not self._defaults:
                return self.function
        return self._call_with_json

    def _instance(self, arguments: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The arguments as the one model instance a wrapped function takes."""
        assert self._wrapped is not None
        name, model = self._wrapped
        try:
            return {name: model.model_validate_json(json.dumps(arguments))}, []
        except ValidationError as exc:
            return arguments, [
                f"'{'.'.join(str(part) for part in error['loc']) or name}': {error['msg']}"
                for error in exc.errors(include_url=False)
            ]
        except (TypeError, ValueError) as exc:  # not JSON data (a hook put an object there)
            return arguments, [f"'{name}': {exc}"]

    def _outside_errors(self, arguments: dict[str, Any]) -> list[str]:
        # Kept by the tool once compiled: the shared cache of callers' schemas is small, and
        # callers sending new schemas must not make an MCP tool compile again on every call.
        if self._outside is None:
            try:
                self._outside = caller_schema(self.parameters, formats=True)
            except SchemaRefused as exc:
                return [f"the tool's schema cannot be used: {exc}"]
        return compiled_argument_errors(self._outside, arguments)

    def _call_with_json(self, **arguments: Any) -> Any:
        converted, problems = self.convert(arguments)
        if problems:
            raise ValueError("invalid arguments: " + "; ".join(problems))
        return self.function(**converted)

    def validate(self, arguments: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Check ``arguments``; return (arguments to call with, errors).

        When the schema rejects them and the function has type hints, pydantic's lax mode gets
        one chance to coerce obvious cases ("5" → 5 for an ``int``); the coerced arguments must
        then pass the schema too, otherwise the original errors are reported.

        A NaN or infinite number anywhere in the arguments is refused first, whatever the
        schema says: every comparison with NaN is false, so no ``minimum`` would stop it, and
        JSON has no such numbers (Python's ``json`` reads ``NaN`` and ``1e999`` as them).
        """
        non_finite = non_finite_errors(arguments)
        if non_finite:
            return arguments, non_finite
        if self.outside_schema:
            return arguments, self._outside_errors(arguments)
        if self._fast_check is not None:
            try:
                self._fast_check(arguments)
                return arguments, []
            except fastjsonschema.JsonSchemaException:
                pass  # invalid: let jsonschema say why, in words the model can use
        errors = argument_errors(self._validator, arguments)
        if not errors or self._coercer is None:
            return arguments, errors
        try:
            coerced = self._coercer.model_validate(arguments).model_dump(
                mode="json", exclude_unset=True
            )
        except ValidationError:
            return arguments, errors
        if (
            set(arguments) - set(coerced)
            or argument_errors(self._validator, coerced)
            or non_finite_errors(coerced)  # "nan" as a string, coerced to a float
        ):
            # A model that ignores unknown fields must not make an invented argument vanish.
            return arguments, errors
        return coerced, []


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | type[BaseModel] | None = None,
    toolset: str = DEFAULT_TOOLSET,
    timeout: float | None = None,
    **settings: Any,
) -> Any:
    """Turn a function into a ``Tool`` outside any agent (for tool modules the CLI loads with
    ``--tools`` and for ``Agent(tools=[...])``). The result is still callable as the function.

        from hermes_agent import tool

        @tool
        def add(a: int, b: int) -> int:
            \"\"\"Add two integers.\"\"\"
            return a + b
    """

    def make(fn: Callable[..., Any]) -> Tool:
        return Tool.from_function(
            fn,
            name=name,
            description=description,
            parameters=parameters,
            toolset=toolset,
            timeout=timeout,
            **settings,
        )

    return make(function) if function is not None else make


def _coercion_model(function: Callable[..., Any]) -> type[BaseModel] | None:
    """A pydantic model of the signature, when it has type hints worth coercing to."""
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    if not any(p.annotation is not inspect.Parameter.empty for p in params):
        return None
    try:
        return arguments_model(function)
    except ToolDefinitionError:
        return None
    except PydanticSchemaGenerationError:  # a type only a hand-written schema describes
        return None


def _compiled(schema: dict[str, Any]) -> tuple[Draft202012Validator, Callable[[Any], Any] | None]:
    """The checked, compiled validators of ``schema``: built once per distinct schema (checking
    a schema against the metaschema and compiling it cost milliseconds, and a service builds
    agents per tenant or request from the same tools), shared by the tools that have it.
    A schema JSON cannot carry is compiled afresh each time."""
    try:
        key = json.dumps(schema)
    except (TypeError, ValueError):
        return make_validator(schema), make_fast_check(schema)
    return _compiled_from_json(key)


@functools.lru_cache(maxsize=1024)
def _compiled_from_json(key: str) -> tuple[Draft202012Validator, Callable[[Any], Any] | None]:
    schema = json.loads(key)  # a private copy: a tool whose dict changes later cannot alter it
    return make_validator(schema), make_fast_check(schema)


def find_tool(tools: Mapping[str, Tool], name: str) -> Tool | None:
    """The tool in ``tools`` (by name) called ``name``, or whose ``aliases`` include it."""
    found = tools.get(name)
    if found is None:
        found = next((t for t in tools.values() if name in t.aliases), None)
    return found


class ToolRegistry:
    """The tools an agent knows, by name, grouped into named toolsets."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def add(self, tool: Tool, *, replace: bool = False) -> Tool:
        if tool.name in self._tools and not replace:
            raise ToolDefinitionError(
                f"a tool named {tool.name!r} is already registered; "
                "pick another name or pass replace=True"
            )
        self._tools[tool.name] = tool
        return tool

    def remove(self, name: str) -> None:
        self._tools.pop(name, None)

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or whose ``aliases`` include it."""
        return find_tool(self._tools, name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Any:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def toolsets(self) -> dict[str, list[str]]:
        """Toolset name → the names of its tools."""
        groups: dict[str, list[str]] = {}
        for tool in self._tools.values():
            groups.setdefault(tool.toolset, []).append(tool.name)
        return groups

    def visible(self, toolsets: Iterable[str] | None = None) -> list[Tool]:
        """The tools in ``toolsets`` (all tools when ``None``)."""
        if toolsets is None:
            return list(self._tools.values())
        wanted = set(toolsets)
        return [tool for tool in self._tools.values() if tool.toolset in wanted]
