"""Hooks: code that runs before and after each stage, with the run's context in hand.

Ten hook points, ``pre_`` and ``post_`` for each stage::

    input       InputParser        pre_input / post_input
    thought     ThoughtGenerator   pre_thought / post_thought
    selection   ToolSelector       pre_selection / post_selection
    execution   ToolExecutor       pre_execution / post_execution
    output      OutputRenderer     pre_output / post_output

A hook is any callable taking the ``RunContext`` (a function, or an object with ``__call__``);
it may be ``async``. What it may do, through the context:

- ``ctx.variables["user_level"] = "expert"`` — fill ``{{ user_level }}`` in the system prompt;
- ``ctx.veto(plan, "reason")`` in ``pre_execution`` — refuse a planned call (403 to the model);
  or change ``plan.arguments`` to rewrite it;
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
from collections.abc import Callable
from typing import Any

from hermes_agent.errors import ConfigError

STAGES = ("input", "thought", "selection", "execution", "output")
HOOK_POINTS = tuple(f"{when}_{stage}" for stage in STAGES for when in ("pre", "post"))

Hook = Callable[[Any], Any]


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


async def call_hook(hook: Hook, ctx: Any) -> None:
    """Call one hook, awaiting it when it is async."""
    outcome = hook(ctx)
    if inspect.isawaitable(outcome):
        await outcome


def hook_name(hook: Hook) -> str:
    name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
    return str(name)


def load_hook(spec: dict[str, Any], *, source: str, point: str) -> Hook | None:
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
    factory = getattr(module, class_name, None)
    if factory is None:
        raise ConfigError(f"{where}: module {module_name!r} has no {class_name!r}")
    try:
        hook = factory(**spec.get("options", {}))
    except Exception as exc:
        raise ConfigError(f"{where}: creating {class_name} failed: {exc}") from exc
    if not callable(hook):
        raise ConfigError(f"{where}: {class_name} instances must be callable (define __call__)")
    return hook  # type: ignore[no-any-return]
