"""Hooks: code that runs before and after each stage, with the run's context in hand.

Ten hook points, ``pre_`` and ``post_`` for each stage::

    input       InputParser        pre_input / post_input
    thought     ThoughtGenerator   pre_thought / post_thought
    selection   ToolSelector       pre_selection / post_selection
    execution   ToolExecutor       pre_execution / post_execution
    output      OutputRenderer     pre_output / post_output

A hook is any callable taking a ``HookContext`` (a function, or an object with ``__call__``),
or an object with an ``execute(context)`` method (the base classes of ``pipeline.hook_classes``,
``PreThoughtHook``, ``PostExecutionHook``...); it may be ``async``. The hook context is a small
view of the run, not the run itself: it shows what a hook may read and offers the operations a
hook may perform —

- read: ``request_id``, ``session_id``, ``user_message``, ``step``, ``point``, ``timestamp``,
  ``messages`` (the conversation as the model sees it, read-only), ``history`` (the session's
  turns the prompt carries), ``completion`` (the model's latest parsed turn; its calls may be
  adjusted in ``pre_selection``, before they are validated), ``planned`` (the calls about to
  run), ``results`` (what the latest calls returned), ``tool_calls``, ``status``, ``error``
  and ``answered_by``; ``model``, ``steps`` and ``usage`` (who answers, and what each model
  turn cost so far — what a tracer or a token budget reads); in a ``post_execution`` hook,
  ``tool_name``, ``input_params`` and ``response`` of the call it follows;
- ``ctx.variables["user_level"] = "expert"`` (or ``ctx.inject_variable(...)``) — fill
  ``{{ user_level }}`` in the system prompt; the run's own variables are there from the start;
- ``ctx.finish(reply, status=200, reason=...)`` in ``pre_input``, ``post_input`` or
  ``pre_thought`` — end the run with this reply: the model is not asked (any more), the run
  is completed with the hook's answer (``loop_status == "answered_by_hook"``), and the trail
  records which hook and why;
- ``ctx.user_message = ...`` and ``ctx.history = [...]`` in ``pre_input`` — rewrite the message
  and the history this run's prompt carries (the session keeps what it holds; the trail keeps
  the original message);
- ``ctx.veto(plan, "reason")`` in ``pre_execution`` — refuse a planned call (403 to the model);
  or change ``plan.arguments`` to rewrite it (the new arguments are validated again, and
  approved again where the tool needs approval);
- ``ctx.rewrite_result(call_id, content)`` in ``post_execution`` — change what a tool returned;
- ``ctx.output = ...`` in ``pre_output`` / ``post_output`` — change the answer (the trail
  records what was appended, or the change); in ``pre_input``, ``post_input`` or
  ``pre_thought`` it is ``ctx.finish(...)``: the run answers with it, the model not asked;
  anywhere else it is an error;
- ``ctx.note(contains_disclaimer=True)`` — add facts to the trail (a ``hook`` record).

Tool arguments and results reach a hook masked as the audit trail shows them: each of the
agent's secrets and redaction patterns is ``[REDACTED]`` in ``input_params``, ``response``,
``results``, ``tool_calls``, ``messages``, ``planned`` and ``completion``. A hook that needs the
real values says so: ``raw_arguments = True`` on its class (``HookBase`` subclasses) or on the
function. A hook that changes masked arguments (``plan.arguments`` in ``pre_execution``) changes
what it wrote; a value it left masked keeps its real value.

Hooks run in the order they were added. A hook that raises fails its stage with status 500 and a
message naming the hook; the run then ends cleanly with that message as its output. A
``PostExecutionHook`` is called once per call of the step; any other hook once per hook point.

In YAML::

    hooks:
      pre_thought:
        - {module: hooks.user_profile, class: UserProfileHook, enabled: true, options: {...}}
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from hermes_agent.audit.redaction import Redactor, redact_messages
from hermes_agent.config import HermesConfig
from hermes_agent.errors import ConfigError, HermesAgentError
from hermes_agent.models.base import Model
from hermes_agent.pipeline.context import PlannedCall, RunContext
from hermes_agent.pipeline.hook_classes import HookBase, PostExecutionHook
from hermes_agent.pipeline.status import Status
from hermes_agent.pipeline.variables import variables_problem
from hermes_agent.stages import HookStage
from hermes_agent.tools.registry import Tool
from hermes_agent.tools.runtime import private_copy
from hermes_agent.types import (
    Completion,
    Message,
    Step,
    ToolCall,
    ToolCallRecord,
    ToolResult,
    Usage,
)

STAGES = tuple(HookStage)
HOOK_POINTS = tuple(f"{when}_{stage}" for stage in STAGES for when in ("pre", "post"))
ANSWERING_POINTS = ("pre_input", "post_input", "pre_thought")
"""Where a hook may end the run with its reply (``HookContext.finish``)."""


_ShownCompletion = tuple[Completion, list[tuple[ToolCall, ToolCall, Any]]]
"""A masked copy of the completion a hook was shown, and its calls: (copy, live, shown)."""


class HookError(HermesAgentError):
    """A hook asked for something its hook point does not allow (it fails the hook: 500)."""


class HookContext:
    """What a hook sees of a run, and what it may change (see the module docstring)."""

    # The run is held under a mangled name: hooks are trusted code (a config file is code),
    # but nothing here should invite them to reach past the sanctioned operations.
    __slots__ = (
        "__call",
        "__raw",
        "__result",
        "__run",
        "__shown_completion",
        "__shown_plans",
        "hook_name",
        "point",
        "timestamp",
    )

    def __init__(
        self,
        run: RunContext,
        point: str,
        hook_name: str = "",
        *,
        call: ToolCallRecord | None = None,
        result: ToolResult | None = None,
    ) -> None:
        self.__run = run
        self.point = point
        """The hook point being run, e.g. ``"pre_execution"``."""
        self.hook_name = hook_name
        """The hook being run, as the trail names it."""
        self.__call = call
        self.__result = result
        self.__raw = False
        # Masked copies handed to this hook, with what each stood for: (copy, live, shown).
        self.__shown_plans: list[tuple[PlannedCall, PlannedCall, Any]] | None = None
        self.__shown_completion: _ShownCompletion | None = None
        self.timestamp = datetime.now(UTC).isoformat(timespec="microseconds")
        """When the hook was called (ISO 8601, UTC)."""

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

    @user_message.setter
    def user_message(self, value: str) -> None:
        self._only_in("pre_input", "rewrite the message")
        if not isinstance(value, str):
            raise TypeError(f"the message must be a string, got {type(value).__name__}")
        run = self.__run
        if value != run.user_message:
            run.note_hook(self.hook_name, self.point, rewrote_message={"from": run.user_message})
            run.user_message = value

    @property
    def history(self) -> Sequence[Message]:
        """The session's turns this run's prompt carries (a summary of older ones first)."""
        return tuple(self.__run.history)

    @history.setter
    def history(self, value: Sequence[Message]) -> None:
        self._only_in("pre_input", "rewrite the history")
        turns = list(value)
        wrong = [type(m).__name__ for m in turns if not isinstance(m, Message)]
        if wrong:
            raise TypeError(f"the history must hold Message objects, got {', '.join(wrong)}")
        run = self.__run
        run.note_hook(
            self.hook_name,
            self.point,
            rewrote_history={"from_turns": len(run.history), "to_turns": len(turns)},
        )
        run.history = turns

    @property
    def step(self) -> int:
        """The loop iteration (0 for the first model turn)."""
        return self.__run.step

    @property
    def messages(self) -> Sequence[Message]:
        """The conversation as the model sees it: system, history, this run's turns (tool
        arguments and results masked, see ``raw_arguments``)."""
        redactor = self._redactor()
        if redactor is None:
            return tuple(self.__run.messages)
        return tuple(redact_messages(self.__run.messages, redactor))

    @property
    def tools(self) -> Sequence[Tool]:
        """The tools visible to this run."""
        return tuple(self.__run.tools.values())

    @property
    def completion(self) -> Completion:
        """The model's latest turn, parsed (its calls' arguments masked, see
        ``raw_arguments``). In ``pre_selection`` its calls may be adjusted (they are validated
        afterwards); a masked value left as it is keeps its real value."""
        redactor = self._redactor()
        if redactor is None:
            return self.__run.completion
        if self.__shown_completion is None:
            live = self.__run.completion
            pairs = []
            for call in live.tool_calls:
                shown = redactor.value(call.arguments)
                masked = dataclasses.replace(call, arguments=private_copy(shown))
                pairs.append((masked, call, private_copy(shown)))
            view = dataclasses.replace(live, tool_calls=[masked for masked, _, _ in pairs])
            self.__shown_completion = (view, pairs)
        return self.__shown_completion[0]

    @property
    def planned(self) -> Sequence[PlannedCall]:
        """The calls that passed the ToolSelector and are about to run (arguments masked, see
        ``raw_arguments``). A ``pre_execution`` hook may change ``plan.arguments``: a masked
        value it leaves as it is keeps its real value."""
        redactor = self._redactor()
        if redactor is None:
            return tuple(self.__run.planned)
        if self.__shown_plans is None:
            self.__shown_plans = []
            for plan in self.__run.planned:
                shown = redactor.value(plan.arguments)
                copy = dataclasses.replace(plan, arguments=private_copy(shown))
                self.__shown_plans.append((copy, plan, private_copy(shown)))
        return tuple(copy for copy, _, _ in self.__shown_plans)

    @property
    def results(self) -> Sequence[ToolResult]:
        """The results of the latest ToolExecutor step, in call order (masked, see
        ``raw_arguments``)."""
        redactor = self._redactor()
        if redactor is None:
            return tuple(self.__run.last_results)
        return tuple(_masked_result(result, redactor) for result in self.__run.last_results)

    last_results = results  # the name hooks used before the hook context existed

    @property
    def tool_calls(self) -> Sequence[ToolCallRecord]:
        """Every call of this run so far, with its result (masked, see ``raw_arguments``)."""
        redactor = self._redactor()
        if redactor is None:
            return tuple(self.__run.tool_calls)
        return tuple(_masked_record(record, redactor) for record in self.__run.tool_calls)

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

    @property
    def answered_by(self) -> dict[str, Any] | None:
        """The hook that answered this run (``{"hook", "point", "reason"}``), if one did."""
        answered = self.__run.answered_by
        return dict(answered) if answered is not None else None

    # -- the call a post-execution hook follows --------------------------------------------

    @property
    def tool_name(self) -> str:
        """The tool of the call this ``post_execution`` hook follows."""
        return self._call().name

    @property
    def input_params(self) -> dict[str, Any]:
        """The arguments that call ran with (a copy; secrets masked as in the trail unless the
        hook asks for ``raw_arguments``)."""
        arguments = self._call().arguments
        redactor = self._redactor()
        return dict(redactor.value(arguments) if redactor is not None else arguments)

    @property
    def response(self) -> dict[str, Any]:
        """What that call gave the model: ``{"status": "success" | "error", "data", "error"}``
        (masked like ``input_params``)."""
        result = self._result()
        redactor = self._redactor()
        if redactor is not None:
            result = _masked_result(result, redactor)
        content = result.content
        if isinstance(content, dict):
            return dict(content)
        return {
            "status": "success" if result.error is None else "error",
            "data": content,
            "error": result.error,
        }

    @property
    def call_id(self) -> str:
        return self._call().id

    def _call(self) -> ToolCallRecord:
        if self.__call is not None:
            return self.__call
        calls = self._step_calls()
        if len(calls) != 1:
            raise HookError(
                f"the {self.point} hook {self.hook_name} asked for the call it follows, and "
                f"{'this step ran ' + str(len(calls)) + ' calls' if calls else 'there is none'}"
                "; read ctx.results and ctx.tool_calls, or subclass PostExecutionHook to be "
                "called once per call"
            )
        return calls[0]

    def _result(self) -> ToolResult:
        if self.__result is not None:
            return self.__result
        call = self._call()
        return next(r for r in self.__run.last_results if r.call_id == call.id)

    def _step_calls(self) -> list[ToolCallRecord]:
        if self.point != "post_execution":
            return []
        run = self.__run
        return run.tool_calls[len(run.tool_calls) - len(run.last_results) :]

    def _redactor(self) -> Redactor | None:
        """What masks this hook's view: ``None`` when there is nothing to mask, or the hook
        asked for ``raw_arguments``."""
        redactor = self.__run.redactor
        return None if self.__raw or not redactor else redactor

    def _begin(self, hook: Any) -> None:
        self.__raw = raw_arguments(hook)

    def _settle(self) -> None:
        """Carry what the hook changed in masked copies over to the live calls: a value it
        left as shown keeps its real value, what it changed is the hook's."""
        if self.__shown_plans is not None:
            for copy, live, shown in self.__shown_plans:
                live.tool = copy.tool
                if not _identical(copy.arguments, shown):
                    live.arguments = _unmask(copy.arguments, shown, live.arguments)
            self.__shown_plans = None
        if self.__shown_completion is not None:
            view, pairs = self.__shown_completion
            live_completion = self.__run.completion
            by_copy = {id(masked): (call, shown) for masked, call, shown in pairs}
            calls = []
            for masked in view.tool_calls:
                if id(masked) not in by_copy:
                    calls.append(masked)  # a call the hook added: its own
                    continue
                call, shown = by_copy[id(masked)]
                call.name = masked.name
                if not _identical(masked.arguments, shown):
                    call.arguments = _unmask(masked.arguments, shown, call.arguments)
                calls.append(call)
            for item in dataclasses.fields(Completion):
                if item.name != "tool_calls":
                    setattr(live_completion, item.name, getattr(view, item.name))
            live_completion.tool_calls = calls
            self.__shown_completion = None

    def _live_plan(self, plan: PlannedCall) -> PlannedCall:
        for copy, live, _ in self.__shown_plans or ():
            if copy is plan:
                return live
        return plan

    def _only_in(self, point: str, what: str) -> None:
        if self.point != point:
            raise HookError(f"a hook can {what} only in {point}, not in {self.point}")

    # -- changing --------------------------------------------------------------------------

    @property
    def variables(self) -> dict[str, Any]:
        """The run's variables (``Agent.run(variables=...)``, ``POST /v1/runs``): read them,
        and set them to fill ``{{ name }}`` placeholders in the system prompt."""
        return self.__run.variables

    def inject_variable(self, name: str, value: object) -> None:
        """Set one variable (``ctx.variables[name] = value``, checked like the run's own)."""
        problem = variables_problem({name: value})
        if problem is not None:
            raise HookError(f"inject_variable({name!r}): {problem}")
        self.__run.variables[name] = value

    def finish(self, reply: str, *, status: int = 200, reason: str | None = None) -> None:
        """End the run now with ``reply`` as its answer (in ``pre_input``, ``post_input`` or
        ``pre_thought``, where the conversation's last turn is the user's or tool results):
        the model is not asked any more, the run is completed with this answer and
        ``status`` (a code below 500: 200, or 403 for a refusal...), and the trail records
        this hook and ``reason``."""
        if self.point not in ANSWERING_POINTS:
            raise HookError(
                f"a hook can finish the run in {', '.join(ANSWERING_POINTS)}, not in "
                f"{self.point}"
                + ("; set ctx.output to change the answer" if "output" in self.point else "")
            )
        if not isinstance(reply, str):
            raise TypeError(f"the reply must be a string, got {type(reply).__name__}")
        if status not in set(Status) or status >= 500:
            raise HookError(
                f"status {status!r}: a hook's answer takes a status below 500 "
                f"({', '.join(str(int(s)) for s in Status if s < 500)})"
            )
        self.__run.answer_by_hook(self.hook_name, self.point, reply, int(status), reason)

    def note(self, **facts: object) -> None:
        """Add facts to this run's audit trail, e.g. ``ctx.note(contains_disclaimer=True)``
        (a ``hook`` record naming this hook; redacted like every record)."""
        self.__run.note_hook(self.hook_name, self.point, facts=facts)

    @property
    def output(self) -> str:
        """The answer (set it in ``pre_output`` / ``post_output`` to change it)."""
        return self.__run.output

    @output.setter
    def output(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"the output must be a string, got {type(value).__name__}")
        if self.point in ANSWERING_POINTS:
            # Before the model answered, an answer set here is the run's answer: the same as
            # ctx.finish(value), so the model is not asked.
            self.finish(value, reason=f"ctx.output set in {self.point}")
            return
        if not self.point.endswith("_output"):
            raise HookError(
                f"a hook can set ctx.output in pre_output or post_output (to change the "
                f"answer) or in {', '.join(ANSWERING_POINTS)} (to answer instead of the "
                f"model), not in {self.point}"
            )
        self.__run.output = value

    def veto(self, plan: PlannedCall, reason: str) -> None:
        """Refuse a planned call (``pre_execution``): the model gets a 403 result."""
        self.__run.veto(self._live_plan(plan), reason)

    def rewrite_result(self, call_id: str, content: object) -> None:
        """Replace what a tool returned (``post_execution``), everywhere it shows."""
        self.__run.rewrite_result(call_id, content)


Hook = Callable[[HookContext], object]


class Hooks:
    """The hooks of an agent, by hook point. Empty points cost one dict lookup."""

    def __init__(self) -> None:
        self._by_point: dict[str, list[Hook]] = {}

    def add(self, point: str, hook: Hook | HookBase) -> Hook:
        if point not in HOOK_POINTS:
            raise ConfigError(f"unknown hook point {point!r}; use one of: {', '.join(HOOK_POINTS)}")
        if isinstance(hook, HookBase) and hook.point and hook.point != point:
            raise ConfigError(
                f"{type(hook).__qualname__} is a {hook.point} hook (by its base class); it "
                f"cannot be added at {point}"
            )
        if not callable(hook):
            raise ConfigError(
                f"a {point} hook must be callable or have an execute(context) method, got "
                f"{type(hook).__name__}"
            )
        self._by_point.setdefault(point, []).append(hook)
        return hook

    def at(self, point: str) -> list[Hook]:
        return self._by_point.get(point, [])

    def __bool__(self) -> bool:
        return bool(self._by_point)


async def call_hook(hook: Hook, ctx: HookContext) -> None:
    """Call one hook, awaiting it when it is async; what it changed in the masked calls it
    was shown reaches the live ones when it returns."""
    ctx._begin(hook)
    try:
        outcome = hook(ctx)
        if inspect.isawaitable(outcome):
            await outcome
    finally:
        ctx._settle()


def raw_arguments(hook: Any) -> bool:
    """Whether ``hook`` asked to see tool arguments and results unmasked: an attribute
    ``raw_arguments = True`` on the hook (a class attribute of a ``HookBase``, or set on a
    function)."""
    if getattr(hook, "raw_arguments", False) is True:
        return True
    wrapped = getattr(hook, "hook", None)  # a hook written the execute(context) way
    return isinstance(hook, _Executing) and getattr(wrapped, "raw_arguments", False) is True


def _masked_result(result: ToolResult, redactor: Redactor) -> ToolResult:
    return dataclasses.replace(
        result,
        content=private_copy(redactor.value(result.content)),
        error=redactor(result.error) if result.error else result.error,
    )


def _masked_record(record: ToolCallRecord, redactor: Redactor) -> ToolCallRecord:
    return dataclasses.replace(
        record,
        arguments=private_copy(redactor.value(record.arguments)),
        result=private_copy(redactor.value(record.result)),
        error=redactor(record.error) if record.error else record.error,
        metadata=dict(record.metadata),
    )


def _identical(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (``1 == True`` in Python, not in JSON)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_identical(v, b[k]) for k, v in a.items())
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _unmask(new: Any, shown: Any, real: Any) -> Any:
    """What a hook's change of masked arguments means for the real ones: where ``new`` still
    holds what the hook was shown, the real value; elsewhere, what the hook wrote."""
    if _identical(new, shown):
        return real
    if isinstance(new, dict) and isinstance(shown, dict) and isinstance(real, dict):
        # Masking keeps the order of keys, so the nth shown key is the nth real one.
        real_key = dict(zip(shown, real, strict=False))
        unmasked = {}
        for key, value in new.items():
            if key in shown and key in real_key:
                unmasked[real_key[key]] = _unmask(value, shown[key], real[real_key[key]])
            else:
                unmasked[key] = value
        return unmasked
    lists = isinstance(new, list) and isinstance(shown, list) and isinstance(real, list)
    if lists and len(new) == len(shown) == len(real):
        return [_unmask(n, s, r) for n, s, r in zip(new, shown, real, strict=True)]
    return new


def hook_name(hook: Hook) -> str:
    """How messages and the trail name a hook: its qualified name."""
    name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
    return str(name)


def config_hooks(config: HermesConfig) -> list[tuple[str, Hook]]:
    """The hooks a config names (``hooks:`` by point, and the ``<point>_hooks:`` lists),
    instantiated in order; disabled ones left out."""
    found: list[tuple[str, Hook]] = []
    for point, specs in config.hooks.items():
        if point not in HOOK_POINTS:
            raise ConfigError(
                f"{config.source}: hooks.{point}: unknown hook point; "
                f"use one of: {', '.join(HOOK_POINTS)}"
            )
        for spec in specs:
            hook = load_hook(spec.model_dump(by_alias=True), source=config.source, point=point)
            if hook is not None:
                found.append((point, hook))
    return found


def config_renderers(config: HermesConfig) -> list[tuple[str, Callable[..., Any]]]:
    """The renderers a config names, instantiated; disabled ones left out."""
    found: list[tuple[str, Callable[..., Any]]] = []
    for name, spec in config.renderers.items():
        renderer = load_hook(
            spec.model_dump(by_alias=True),
            source=config.source,
            point=f"renderers.{name}",
            hook_class=False,
        )
        if renderer is not None:
            found.append((name, renderer))
    return found


def per_call(hook: Hook) -> bool:
    """Whether ``hook`` is called once per tool call of a step (a ``PostExecutionHook``)."""
    return isinstance(hook, PostExecutionHook)


def load_hook(
    spec: dict[str, Any], *, source: str, point: str, hook_class: bool = True
) -> Callable[..., Any] | None:
    """Instantiate a hook (or, with ``hook_class=False``, a renderer) from its YAML spec
    (``module``, ``class``, ``enabled``, ``options``); ``None`` when it is disabled. A hook
    class may define ``execute(self, context)`` instead of ``__call__``."""
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
    members = _own_members(factory)
    if "__call__" not in members and not (hook_class and "execute" in members):
        raise ConfigError(
            f"{where}: class {module_name}.{class_name} does not define "
            + (
                "__call__ or execute; a hook class must define __call__(self, ctx) or "
                "execute(self, context)"
                if hook_class
                else "__call__; a renderer class must define __call__(self, view)"
            )
        )
    try:
        hook = factory(**spec.get("options", {}))
    except Exception as exc:
        raise ConfigError(f"{where}: creating {class_name} failed: {exc}") from exc
    if not callable(hook):
        if hook_class and callable(getattr(hook, "execute", None)):
            return _Executing(hook)
        raise ConfigError(f"{where}: {class_name} instances must be callable (define __call__)")
    return hook


class _Executing:
    """A hook object written the ``execute(context)`` way, as a callable hook."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook
        self.__qualname__ = type(hook).__qualname__

    def __call__(self, ctx: HookContext) -> Any:
        return self.hook.execute(ctx)


def as_hook(hook: Any) -> Hook:
    """A callable hook from a hook object (one with ``execute(context)`` is wrapped)."""
    if not callable(hook) and callable(getattr(hook, "execute", None)):
        return _Executing(hook)
    return hook  # type: ignore[no-any-return]


def _own_members(cls: type) -> set[str]:
    """Names defined by ``cls`` or its bases other than ``object`` and ``type``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass not in (object, type):
            names.update(vars(klass))
    return names
