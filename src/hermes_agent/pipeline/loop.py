"""The spine: one user message in, one answer out, through five stages in order.

    1 InputParser       check the message, lay out system prompt + history + message
    ┌ repeat ≤ max_iterations (+ turns that only ask again for the answer)
    │   route             the tool model, or (with answer_model) the answer model once a
    │                     turn of the tool model called no tool
    │ 2 ThoughtGenerator  model → parsed completion (no calls and nothing malformed → done)
    │                     ↺ ask again: the answer model takes over, or the answer failed
    │                       its output_type and goes back with the errors
    │ 3 ToolSelector      which calls may run, with which arguments; refusals become results
    │                     (the caller's own tools: their valid calls end the run, see
    │                      pipeline.client_tools)
    │ 4 ToolExecutor      run them concurrently; results go back to the model
    └
    5 OutputRenderer    the answer, or an honest account of why there is none

Each stage runs between its ``pre_`` and ``post_`` hooks; a hook may end the run with its own
reply (``HookContext.finish``), and the stage and the ones after it up to the output do not
run. The run's budgets (``pipeline.budget``) are checked before each model turn and before a
turn's calls run; ``run_timeout_s`` is a deadline around everything before the output stage.
A stage that fails is the run's failure, with its message — except a durable run's store
failing (``StoreUnavailable``), which goes through every stage untouched: it is never an
answer, and the attempt ends there. A dry run stops after the ToolSelector and returns the
planned calls; no tool runs. No stage calls another; everything they share lives in the
RunContext.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from hermes_agent.errors import StoreUnavailable, is_store_error
from hermes_agent.pipeline.budget import note_overrun, spent, timed_out
from hermes_agent.pipeline.client_tools import hand_over
from hermes_agent.pipeline.context import RunContext
from hermes_agent.pipeline.hooks import HookContext, Hooks, call_hook, hook_name, per_call
from hermes_agent.pipeline.input_parser import InputParser, load_history
from hermes_agent.pipeline.output_renderer import OutputRenderer
from hermes_agent.pipeline.status import Status
from hermes_agent.pipeline.thought_generator import ThoughtGenerator
from hermes_agent.pipeline.tool_executor import ToolExecutor
from hermes_agent.pipeline.tool_selector import ToolSelector
from hermes_agent.stages import HookStage
from hermes_agent.types import RunResult, ToolCallRecord, ToolResult


class Stage(Protocol):
    @property
    def name(self) -> str: ...  # a StageName for the five; read-only, so any str fits

    def run(self, ctx: RunContext) -> Any: ...


_input_parser = InputParser()
_thought_generator = ThoughtGenerator()
_tool_selector = ToolSelector()
_tool_executor = ToolExecutor()
_output_renderer = OutputRenderer()
_NO_HOOKS = Hooks()


async def run_turn(ctx: RunContext, hooks: Hooks | None = None) -> RunResult:
    """Run one user message through the pipeline and return the result."""
    hooks = hooks or _NO_HOOKS
    limit = ctx.budget.timeout_s
    if limit is None:
        await _steps(ctx, hooks)
    else:
        elapsed = (time.perf_counter_ns() - ctx.started_ns) / 1e9
        deadline = asyncio.timeout(max(0.0, limit - elapsed))
        try:
            async with deadline:
                await _steps(ctx, hooks)
        except TimeoutError:
            if not deadline.expired():
                raise
            timed_out(ctx)  # what was under way was cancelled; the output says so
    await _run_stage(ctx, hooks, HookStage.OUTPUT, _output_renderer)
    return ctx.result()


async def _steps(ctx: RunContext, hooks: Hooks) -> None:
    """Everything before the output stage."""
    # pre_input hooks may rewrite the history: it is loaded before them.
    early = (lambda: load_history(ctx)) if hooks.at("pre_input") else None
    await _run_stage(ctx, hooks, HookStage.INPUT, _input_parser, prepare=early)

    while not ctx.finished and ctx.step < ctx.step_limit:
        if spent(ctx):  # max_run_tokens / max_run_cost: no further model turn
            break
        ctx.route()  # the tool model, or the answer model once the tools are done
        await _run_stage(ctx, hooks, HookStage.THOUGHT, _thought_generator)
        if ctx.finished:
            if ctx.loop_status == "completed":
                note_overrun(ctx)  # an answer that crossed a budget is kept, with a warning
            break
        if ctx.asks_again:  # no call to run: the next turn is another try at the answer
            ctx.step += 1
            continue
        if spent(ctx):  # the turn used up the budget: its calls do not run
            break
        await _run_stage(ctx, hooks, HookStage.SELECTION, _tool_selector)
        if ctx.finished:
            break
        if ctx.dry_run:
            _plan_only(ctx)
            break
        if hand_over(ctx):  # the caller runs these calls itself: the run ends with them
            break
        await _run_stage(ctx, hooks, HookStage.EXECUTION, _tool_executor)
        if ctx.unusable_turns > ctx.limits.max_retries:
            stop_unusable(ctx)
        ctx.step += 1


def stop_unusable(ctx: RunContext) -> None:
    """End a run whose last turns ran no call. When the approver refused calls in them (denied,
    or the approval expired), the run ends with 403 and the denial, not as the model's fault."""
    turns = ctx.unusable_turns
    if ctx.denied_turns and ctx.last_denial is not None:
        others = turns - ctx.denied_turns
        rest = f"; in {others} of them the model's calls were unusable too" if others else ""
        ctx.fail(
            Status.DENIED,
            f"{ctx.last_denial}: no call could run in {turns} turns in a row, and the approver "
            f"refused calls in {ctx.denied_turns} of them{rest}",
        )
    else:
        ctx.fail(
            Status.MODEL_ERROR,
            f"the model produced no usable tool call in {turns} turns in a row "
            "(malformed output or invalid calls); see the steps for what it wrote",
        )
    ctx.output = f"I could not complete the request: {ctx.error}."


async def _run_stage(
    ctx: RunContext,
    hooks: Hooks,
    stage: HookStage,
    runner: Stage,
    prepare: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """One stage between its hooks, then its audit record. A failing hook fails the run with
    500 — cleanly; a hook that answers the run skips the stage and its post hooks."""
    started = time.perf_counter_ns()
    ran = False
    ready = prepare is None or await _guarded(ctx, runner.name, prepare)
    if ready and await _hooks(ctx, hooks, f"pre_{stage}", runner.name):
        ran = await _guarded(ctx, runner.name, lambda: runner.run(ctx))
        await _hooks(ctx, hooks, f"post_{stage}", runner.name)
    if ctx.recorder is not None:
        # A stage that failed (in itself or in a hook) is recorded with its error; only one a
        # hook's answer skipped leaves no records of its own.
        ctx.recorder.record(ctx, stage, runner.name, started, ran=ran or ctx.answered_by is None)


async def _guarded(ctx: RunContext, name: str, work: Callable[[], Any]) -> bool:
    """Do a stage's work (sync or async); a defect fails the run with its message
    (``False``)."""
    try:
        outcome = work()
        if inspect.isawaitable(outcome):
            await outcome
    except StoreUnavailable:
        raise  # a durable run's store failed: never an answer; the attempt ends
    except Exception as exc:  # a defect must end the run with a message, not a traceback
        if ctx.journal is not None and is_store_error(exc):
            # A durable run's store (its session, say) failed under this stage: that is
            # no answer either, and the run resumes from its journal.
            raise StoreUnavailable(f"{name}: the store failed: {type(exc).__name__}") from exc
        message = f"{name} failed unexpectedly: {type(exc).__name__}: {exc}"
        ctx.fail(Status.INTERNAL_ERROR, message)
        ctx.output = ctx.output or f"The request could not be completed: {message}"
        ctx.log_stage(name, Status.INTERNAL_ERROR, error=message)
        return False
    return True


async def _hooks(ctx: RunContext, hooks: Hooks, point: str, stage_name: str) -> bool:
    """Run a point's hooks; ``False`` when one failed or answered the run (the stage is not
    run)."""
    for hook in hooks.at(point):
        name = hook_name(hook)
        before = ctx.output
        try:
            if per_call(hook):
                for call, result in _step_calls(ctx):
                    await call_hook(hook, HookContext(ctx, point, name, call=call, result=result))
            else:
                await call_hook(hook, HookContext(ctx, point, name))
        except StoreUnavailable:
            raise
        except Exception as exc:
            message = f"hook {name} ({point}) failed: {type(exc).__name__}: {exc}"
            ctx.fail(Status.INTERNAL_ERROR, message)
            ctx.output = f"The request could not be completed: {message}"
            ctx.log_stage(stage_name, Status.INTERNAL_ERROR, error=message)
            return False
        if ctx.output != before and point.endswith("_output"):
            ctx.note_hook(name, point, changed_output=_change(before, ctx.output))
        if ctx.answered_by is not None and not point.endswith("_output"):
            return False
    return True


def _step_calls(ctx: RunContext) -> list[tuple[ToolCallRecord, ToolResult]]:
    """The calls of the step that just ran, with what each gave the model."""
    records = ctx.tool_calls[len(ctx.tool_calls) - len(ctx.last_results) :]
    return list(zip(records, ctx.last_results, strict=True))


def _change(before: str, after: str) -> dict[str, str]:
    """What a hook did to the answer, for the trail: what it appended or prepended, or the
    answer it replaced (the output record holds the new one)."""
    if before and after.startswith(before):
        return {"appended": after[len(before) :]}
    if before and after.endswith(before):
        return {"prepended": after[: len(after) - len(before)]}
    return {"replaced": before}


def _plan_only(ctx: RunContext) -> None:
    """A dry run ends here: report the planned calls, validated, without running any."""
    for plan in ctx.planned:
        ctx.tool_calls.append(
            ToolCallRecord(plan.tool.name, plan.arguments, None, 200, None, plan.call.id)
        )
    for _, refused in ctx.rejected:
        ctx.tool_calls.append(
            ToolCallRecord(
                refused.name, {}, None, refused.status_code, refused.error, refused.call_id
            )
        )
    ctx.steps[-1].tool_calls = list(ctx.tool_calls)
    ctx.loop_status = "dry_run_complete"
    ctx.finished = True
