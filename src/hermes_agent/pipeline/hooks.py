"""Hooks: code that runs before and after each stage, with the run's context in hand.

Ten hook points, ``pre_`` and ``post_`` for each stage::

    input       InputParser        pre_input / post_input
    thought     ThoughtGenerator   pre_thought / post_thought
    selection   ToolSelector       pre_selection / post_selection
    execution   ToolExecutor       pre_execution / post_execution
    output      OutputRenderer     pre_output / post_output

A hook is any callable taking a ``HookContext`` (a function, or an object with ``__call__``);
it may be ``async``. The hook context is a small view of the run, not the run itself: it shows
what a hook may read and offers the operations a hook may perform —

- read: ``request_id``, ``session_id``, ``user_message``, ``step``, ``point``, ``messages``
  (the conversation as the model sees it, read-only), ``completion`` (the model's latest parsed
  turn; its calls may be adjusted in ``pre_selection``, before they are validated), ``planned``
  (the calls about to run), ``results`` (what the latest calls returned), ``tool_calls``,
  ``status`` and ``error``; ``model``, ``steps`` and ``usage`` (who answers, and what each
  model turn cost so far — what a tracer or a token budget reads);
- ``ctx.variables["user_level"] = "expert"`` — fill ``{{ user_level }}`` in the system prompt;
- ``ctx.veto(plan, "reason")`` in ``pre_execution`` — refuse a planned call (403 to the model);
  or change ``plan.arguments`` to rewrite it (the new arguments are validated again, and
  approved again where the tool needs approval);
- ``ctx.rewrite_result(call_id, content)`` in ``post_execution`` — change what a tool returned;
- ``ctx.output = ...`` in ``post_output`` — change the answer.

Hooks run in the order they were added. A hook that raises fails its stage with status 500 and a
message naming the hook; the run then ends cleanly with that message as its output.

In YAML::

    hooks:
      pre_thought:
        - {module: hooks.user_profile, class: UserProfileHook, enabled: true, options: {...}}
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from hermes_agent.errors import ConfigError
from hermes_agent.models.base import Model
from hermes_agent.pipeline.context import PlannedCall, RunContext
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Completion, Message, Step, ToolCallRecord, ToolResult, Usage

STAGES = ("input", "thought", "selection", "execution", "output")
HOOK_POINTS = tuple(f"{when}_{stage}" for stage in STAGES for when in ("pre", "post"))


class HookContext:
    """What a hook sees of a run, and what it may change (see the module docstring)."""

    # The run is held under a mangled name: hooks are trusted code (a config file is code),
    # but nothing here should invite them to reach past the sanctioned operations.
    __slots__ = ("__run", "point")

    def __init__(self, run: RunContext, point: str) -> None:
        self.__run = run
        self.point = point
        """The hook point being run, e.g. ``"pre_execution"``."""

    # -- reading -------------------------------------------------------------------------

    @property
    def request_id(self) -> str:
        return self.__run.request_id

    @property
    def session_id(self) -> str:
        return self.__run.session_id

    @property
    def user_message(self) -> str:
        return self.__run.user_message

    @property
    def step(self) -> int:
        """The loop iteration (0 for the first model turn)."""
        return self.__run.step

    @property
    def messages(self) -> Sequence[Message]:
        """The conversation as the model sees it: system, history, this run's turns."""
        return tuple(self.__run.messages)

    @property
    def tools(self) -> Sequence[Tool]:
        """The tools visible to this run."""
        return tuple(self.__run.tools.values())

    @property
    def completion(self) -> Completion:
        """The model's latest turn, parsed. In ``pre_selection`` its calls may be adjusted
        (they are validated afterwards)."""
        return self.__run.completion

    @property
    def planned(self) -> Sequence[PlannedCall]:
        """The calls that passed the ToolSelector and are about to run."""
        return tuple(self.__run.planned)

    @property
    def results(self) -> Sequence[ToolResult]:
        """The results of the latest ToolExecutor step, in call order."""
        return tuple(self.__run.last_results)

    last_results = results  # the name hooks used before the hook context existed

    @property
    def tool_calls(self) -> Sequence[ToolCallRecord]:
        """Every call of this run so far, with its result."""
        return tuple(self.__run.tool_calls)

    @property
    def model(self) -> Model:
        """The model this run calls."""
        return self.__run.model

    @property
    def steps(self) -> Sequence[Step]:
        """The model turns of this run so far (model, usage, timing, calls), oldest first."""
        return tuple(self.__run.steps)

    @property
    def usage(self) -> Usage:
        """Tokens and model requests of this run so far (a copy)."""
        usage = self.__run.usage
        return Usage(usage.prompt_tokens, usage.completion_tokens, usage.requests)

    @property
    def status(self) -> int:
        return int(self.__run.status)

    @property
    def error(self) -> str | None:
        return self.__run.error

    # -- changing --------------------------------------------------------------------------

    @property
    def variables(self) -> dict[str, Any]:
        """Values for ``{{ name }}`` placeholders in the system prompt; hooks fill them."""
        return self.__run.variables

    @property
    def output(self) -> str:
        """The answer (set it in ``pre_output`` / ``post_output`` to change it)."""
        return self.__run.output

    @output.setter
    def output(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"the output must be a string, got {type(value).__name__}")
        self.__run.output = value

    def veto(self, plan: PlannedCall, reason: str) -> None:
        """Refuse a planned call (``pre_execution``): the model gets a 403 result."""
        self.__run.veto(plan, reason)

    def rewrite_result(self, call_id: str, content: Any) -> None:
        """Replace what a tool returned (``post_execution``), everywhere it shows."""
        self.__run.rewrite_result(call_id, content)


Hook = Callable[[HookContext], Any]


class Hooks:
    """The hooks of an agent, by hook point. Empty points cost one dict lookup."""

    def __init__(self) -> None:
        self._by_point: dict[str, list[Hook]] = {}

    def add(self, point: str, hook: Hook) -> Hook:
        if point not in HOOK_POINTS:
            raise ConfigError(f"unknown hook point {point!r}; use one of: {', '.join(HOOK_POINTS)}")
        if not callable(hook):
            raise ConfigError(f"a {point} hook must be callable, got {type(hook).__name__}")
        self._by_point.setdefault(point, []).append(hook)
        return hook

    def at(self, point: str) -> list[Hook]:
        return self._by_point.get(point, [])

    def __bool__(self) -> bool:
        return bool(self._by_point)


async def call_hook(hook: Hook, ctx: HookContext) -> None:
    """Call one hook, awaiting it when it is async."""
    outcome = hook(ctx)
    if inspect.isawaitable(outcome):
        await outcome


def hook_name(hook: Hook) -> str:
    name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
    return str(name)


def load_hook(spec: dict[str, Any], *, source: str, point: str) -> Callable[..., Any] | None:
    """Instantiate a hook from its YAML spec (``module``, ``class``, ``enabled``, ``options``);
    ``None`` when it is disabled."""
    if not spec.get("enabled", True):
        return None
    module_name, class_name = spec.get("module"), spec.get("class")
    where = f"{source}: hooks.{point}"
    if not isinstance(module_name, str) or not isinstance(class_name, str):
        raise ConfigError(f"{where}: each hook needs 'module' and 'class', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{where}: cannot import module {module_name!r} ({exc}); "
            "check the name and that its folder is on PYTHONPATH"
        ) from exc
    factory = vars(module).get(class_name)
    if factory is None:
        raise ConfigError(f"{where}: module {module_name!r} has no {class_name!r}")
    # A config file is code, but it should not run what it did not mean to: only a class whose
    # instances are callable is instantiated (``module: os, class: system`` is refused here,
    # before anything is called).
    if not inspect.isclass(factory):
        raise ConfigError(
            f"{where}: {module_name}.{class_name} is a {type(factory).__name__}, not a class; "
            "name a class whose instances are called as the hook (it defines __call__)"
        )
    if "__call__" not in _own_members(factory):
        raise ConfigError(
            f"{where}: class {module_name}.{class_name} does not define __call__; a hook or "
            "renderer class must define __call__(self, ctx)"
        )
    try:
        hook = factory(**spec.get("options", {}))
    except Exception as exc:
        raise ConfigError(f"{where}: creating {class_name} failed: {exc}") from exc
    if not callable(hook):
        raise ConfigError(f"{where}: {class_name} instances must be callable (define __call__)")
    return hook  # type: ignore[no-any-return]


def _own_members(cls: type) -> set[str]:
    """Names defined by ``cls`` or its bases other than ``object`` and ``type``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass not in (object, type):
            names.update(vars(klass))
    return names
