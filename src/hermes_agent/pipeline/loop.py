"""The spine: one user message in, one answer out, through five stages in order.

    1 InputParser       check the message, lay out system prompt + history + message
    ┌ repeat ≤ max_iterations
    │ 2 ThoughtGenerator  model → parsed completion (no calls and nothing malformed → done)
    │ 3 ToolSelector      which calls may run, with which arguments; refusals become results
    │ 4 ToolExecutor      run them concurrently; results go back to the model
    └
    5 OutputRenderer    the answer, or an honest account of why there is none

A dry run stops after the ToolSelector and returns the planned calls; no tool runs.

No stage calls another; everything they share lives in the RunContext.
"""

from __future__ import annotations

from hermes_agent.pipeline.context import RunContext
from hermes_agent.pipeline.input_parser import InputParser
from hermes_agent.pipeline.output_renderer import OutputRenderer
from hermes_agent.pipeline.status import Status
from hermes_agent.pipeline.thought_generator import ThoughtGenerator
from hermes_agent.pipeline.tool_executor import ToolExecutor
from hermes_agent.pipeline.tool_selector import ToolSelector
from hermes_agent.types import RunResult, ToolCallRecord

_input_parser = InputParser()
_thought_generator = ThoughtGenerator()
_tool_selector = ToolSelector()
_tool_executor = ToolExecutor()
_output_renderer = OutputRenderer()


async def run_turn(ctx: RunContext) -> RunResult:
    """Run one user message through the pipeline and return the result."""
    _input_parser.run(ctx)

    while not ctx.finished and ctx.step < ctx.limits.max_iterations:
        await _thought_generator.run(ctx)
        if ctx.finished:
            break
        _tool_selector.run(ctx)
        if ctx.dry_run:
            _plan_only(ctx)
            break
        await _tool_executor.run(ctx)
        if ctx.unusable_turns > ctx.limits.max_retries:
            ctx.fail(
                Status.MODEL_ERROR,
                f"the model produced no usable tool call in {ctx.unusable_turns} turns in a row "
                "(malformed output or invalid calls); see the steps for what it wrote",
            )
            ctx.output = f"I could not complete the request: {ctx.error}."
        ctx.step += 1

    _output_renderer.run(ctx)
    return ctx.result()


def _plan_only(ctx: RunContext) -> None:
    """A dry run ends here: report the planned calls, validated, without running any."""
    for plan in ctx.planned:
        ctx.tool_calls.append(
            ToolCallRecord(plan.call.name, plan.arguments, None, 200, None, plan.call.id)
        )
    for _, refused in ctx.rejected:
        ctx.tool_calls.append(
            ToolCallRecord(
                refused.name,
                {},
                refused.content,
                refused.status_code,
                refused.error,
                refused.call_id,
            )
        )
    ctx.steps[-1].tool_calls = list(ctx.tool_calls)
    ctx.loop_status = "dry_run_complete"
    ctx.finished = True
