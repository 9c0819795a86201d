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

Each stage runs between its ``pre_`` and ``post_`` hooks. A stage that fails is the run's
failure, with its message — except a durable run's store failing (``StoreUnavailable``), which
goes through every stage untouched: it is never an answer, and the attempt ends there. A dry
run stops after the ToolSelector and returns the planned calls; no tool runs. No stage calls
another; everything they share lives in the RunContext.
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Protocol

from hermes_agent.errors import StoreUnavailable, is_store_error
from hermes_agent.pipeline.client_tools import hand_over
from hermes_agent.pipeline.context import RunContext
from hermes_agent.pipeline.hooks import HookContext, Hooks, call_hook, hook_name
from hermes_agent.pipeline.input_parser import InputParser
from hermes_agent.pipeline.output_renderer import OutputRenderer
from hermes_agent.pipeline.status import Status
from hermes_agent.pipeline.thought_generator import ThoughtGenerator
from hermes_agent.pipeline.tool_executor import ToolExecutor
from hermes_agent.pipeline.tool_selector import ToolSelector
from hermes_agent.types import RunResult, ToolCallRecord


class Stage(Protocol):
    name: str

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
    await _run_stage(ctx, hooks, "input", _input_parser)

    while not ctx.finished and ctx.step < ctx.step_limit:
        ctx.route()  # the tool model, or the answer model once the tools are done
        await _run_stage(ctx, hooks, "thought", _thought_generator)
        if ctx.finished:
            break
        if ctx.asks_again:  # no call to run: the next turn is another try at the answer
            ctx.step += 1
            continue
        await _run_stage(ctx, hooks, "selection", _tool_selector)
        if ctx.finished:
            break
        if ctx.dry_run:
            _plan_only(ctx)
            break
        if hand_over(ctx):  # the caller runs these calls itself: the run ends with them
            break
        await _run_stage(ctx, hooks, "execution", _tool_executor)
        if ctx.unusable_turns > ctx.limits.max_retries:
            ctx.fail(
                Status.MODEL_ERROR,
                f"the model produced no usable tool call in {ctx.unusable_turns} turns in a row "
                "(malformed output or invalid calls); see the steps for what it wrote",
            )
            ctx.output = f"I could not complete the request: {ctx.error}."
        ctx.step += 1

    await _run_stage(ctx, hooks, "output", _output_renderer)
    return ctx.result()


async def _run_stage(ctx: RunContext, hooks: Hooks, stage: str, runner: Stage) -> None:
    """One stage between its hooks, then its audit record. A failing hook fails the run with
    500 — cleanly."""
    started = time.perf_counter_ns()
    if await _hooks(ctx, hooks, f"pre_{stage}", runner.name):
        try:
            outcome = runner.run(ctx)
            if inspect.isawaitable(outcome):
                await outcome
        except StoreUnavailable:
            raise  # a durable run's store failed: never an answer; the attempt ends
        except Exception as exc:  # a defect must end the run with a message, not a traceback
            if ctx.journal is not None and is_store_error(exc):
                # A durable run's store (its session, say) failed under this stage: that is
                # no answer either, and the run resumes from its journal.
                raise StoreUnavailable(
                    f"{runner.name}: the store failed: {type(exc).__name__}"
                ) from exc
            message = f"{runner.name} failed unexpectedly: {type(exc).__name__}: {exc}"
            ctx.fail(Status.TOOL_ERROR, message)
            ctx.output = ctx.output or f"The request could not be completed: {message}"
            ctx.log_stage(runner.name, Status.TOOL_ERROR, error=message)
        await _hooks(ctx, hooks, f"post_{stage}", runner.name)
    if ctx.recorder is not None:
        ctx.recorder.record(ctx, stage, runner.name, started)


async def _hooks(ctx: RunContext, hooks: Hooks, point: str, stage_name: str) -> bool:
    for hook in hooks.at(point):
        try:
            await call_hook(hook, HookContext(ctx, point))
        except StoreUnavailable:
            raise
        except Exception as exc:
            message = f"hook {hook_name(hook)} ({point}) failed: {type(exc).__name__}: {exc}"
            ctx.fail(Status.TOOL_ERROR, message)
            ctx.output = f"The request could not be completed: {message}"
            ctx.log_stage(stage_name, Status.TOOL_ERROR, error=message)
            return False
    return True


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
