"""Stage 5 — OutputRenderer: turn the end of the loop into the answer the caller gets.

Three endings: the model answered in text (200; with ``output_type``, the validated value as
JSON), or a hook answered (its reply and status); the loop ran out of iterations or a run
budget (206, with an honest message that says so and shows the last tool results); or a stage
failed or the run timed out (its status and message stand). An empty final answer after tool
calls is not passed off as an answer: the output then reports the last tool results verbatim,
with status 206.
"""

from __future__ import annotations

from hermes_agent.events import OutputEvent
from hermes_agent.messages import translate_output
from hermes_agent.pipeline.context import RunContext
from hermes_agent.pipeline.renderers import RenderInput, rendered
from hermes_agent.pipeline.status import Status
from hermes_agent.protocol.chatml import to_json
from hermes_agent.stages import StageName
from hermes_agent.types import Message, ToolCallRecord

_MAX_RESULT_CHARS = 500


class OutputRenderer:
    name = StageName.OUTPUT_RENDERER

    def run(self, ctx: RunContext) -> RunContext:
        if ctx.loop_status in ("dry_run_complete", "client_tool_calls"):
            ctx.output = ctx.completion.content.strip()
        elif ctx.loop_status == "budget_exceeded":  # pipeline.budget said which, and why
            ctx.output += _last_results(ctx.tool_calls)
        elif ctx.loop_status == "answered_by_hook":
            pass  # the hook's reply is the answer (pipeline.hooks)
        elif ctx.error is None:
            if not ctx.finished:
                ctx.loop_status = "max_iterations"
                ctx.stopped_by = "max_iterations"
                ctx.status = Status.PARTIAL
                ctx.output = (
                    f"I stopped after {ctx.limits.max_iterations} steps "
                    f"(max_iterations={ctx.limits.max_iterations}) without a final answer."
                    + _last_results(ctx.tool_calls)
                )
            elif ctx.output_spec is not None and ctx.data is not None:
                ctx.output = ctx.output_spec.dump(ctx.data)  # the validated value, as JSON
            else:
                answer = ctx.completion.content.strip()
                if answer:
                    ctx.output = answer
                elif ctx.tool_calls:
                    ctx.status = Status.PARTIAL
                    ctx.output = "The model gave no final answer." + _last_results(ctx.tool_calls)
                else:
                    ctx.output = answer
        # The runtime's own words (not a model's answer) in the run's language.
        ctx.output = translate_output(ctx.output, int(ctx.status), ctx.language, ctx.error)
        saved = ctx.messages_to_save()
        if saved and saved[-1].role != "assistant":
            # Close the turn, failed or not: the next request of this session must not start
            # with two user messages in a row (many chat templates reject that).
            ctx.new_messages.append(Message("assistant", ctx.output))
        if ctx.renderer is not None:
            view = RenderInput(
                ctx.output, int(ctx.status), ctx.tool_calls, ctx.channel, dict(ctx.variables)
            )
            try:
                ctx.rendered = rendered(view, ctx.renderer_name, ctx.renderer)
            except Exception as exc:
                message = f"renderer {ctx.renderer_name!r} failed: {type(exc).__name__}: {exc}"
                ctx.fail(Status.INTERNAL_ERROR, message)
        ctx.log_stage(self.name, ctx.status, output_chars=len(ctx.output))
        ctx.emit(OutputEvent(status=int(ctx.status), output=ctx.output, error=ctx.error))
        return ctx


def _last_results(records: list[ToolCallRecord]) -> str:
    if not records:
        return ""
    last_step = records[-3:]
    lines = []
    for record in last_step:
        text = to_json(record.result) if record.error is None else f"error: {record.error}"
        if len(text) > _MAX_RESULT_CHARS:
            text = text[:_MAX_RESULT_CHARS] + "…"
        lines.append(f"- {record.name}({to_json(record.arguments)}) → {text}")
    return " Last tool results:\n" + "\n".join(lines)
