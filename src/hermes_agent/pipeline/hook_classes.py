"""Base classes for hooks written as classes with an ``execute(context)`` method.

A hook is any callable (``pipeline.hooks``); these bases are for code written the other common
way — a class per hook point whose ``execute`` receives the hook context (and may return it;
the return value is ignored)::

    from hermes_agent import PreThoughtHook

    class UserProfileHook(PreThoughtHook):
        def execute(self, context):
            context.inject_variable("user_level", "vip")
            return context

    agent.add_hook(UserProfileHook())     # the point comes from the base class

A ``PostExecutionHook`` is called once for each tool call of a step, with ``tool_name``,
``input_params`` and ``response`` of that call on its context. Adding a hook at a point other
than its base class's is refused (a ``PostExecutionHook`` listed under ``pre_thought`` is a
mistake the config should name).
"""

from __future__ import annotations

from typing import Any, ClassVar


class HookBase:
    """A hook as a class: ``execute(context)`` does the work; calling the hook calls it."""

    point: ClassVar[str] = ""
    """The hook point this kind of hook runs at (``""``: any)."""

    raw_arguments: ClassVar[bool] = False
    """``True``: this hook sees tool arguments and results as they are, secrets included;
    by default it sees them masked as the audit trail shows them (``[REDACTED]``)."""

    def execute(self, context: Any) -> Any:
        """Do the hook's work with the ``HookContext`` (returning it, or nothing)."""
        raise NotImplementedError(f"{type(self).__qualname__} must define execute(context)")

    def __call__(self, context: Any) -> Any:
        return self.execute(context)


class PreInputHook(HookBase):
    point = "pre_input"


class PostInputHook(HookBase):
    point = "post_input"


class PreThoughtHook(HookBase):
    point = "pre_thought"


class PostThoughtHook(HookBase):
    point = "post_thought"


class PreSelectionHook(HookBase):
    point = "pre_selection"


class PostSelectionHook(HookBase):
    point = "post_selection"


class PreExecutionHook(HookBase):
    point = "pre_execution"


class PostExecutionHook(HookBase):
    """Called once per tool call of the step, after the calls ran."""

    point = "post_execution"


class PreOutputHook(HookBase):
    point = "pre_output"


class PostOutputHook(HookBase):
    point = "post_output"


HOOK_CLASSES: tuple[type[HookBase], ...] = (
    PreInputHook,
    PostInputHook,
    PreThoughtHook,
    PostThoughtHook,
    PreSelectionHook,
    PostSelectionHook,
    PreExecutionHook,
    PostExecutionHook,
    PreOutputHook,
    PostOutputHook,
)
