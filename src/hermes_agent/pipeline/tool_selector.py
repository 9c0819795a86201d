"""Stage 3 — ToolSelector: decide which of the model's calls may run, and with what arguments.

A call runs only if its tool exists, is visible to this run, is available, and its arguments
pass the schema. Every refused call gets a result that tells the model what to fix — the list of
real tool names for an unknown one, the exact argument errors for an invalid one — and a block
that could not be parsed at all is reported the same way.
"""

from __future__ import annotations

from hermes_agent.pipeline.context import PlannedCall, RunContext
from hermes_agent.pipeline.status import Status
from hermes_agent.types import ToolCall, ToolResult


class ToolSelector:
    name = "ToolSelector"

    def run(self, ctx: RunContext) -> RunContext:
        ctx.planned = []
        ctx.rejected = []
        for position, call in enumerate(ctx.completion.tool_calls):
            refusal = self._refusal(ctx, call)
            if refusal is not None:
                ctx.rejected.append((position, refusal))
        offset = len(ctx.completion.tool_calls)
        for position, error in enumerate(ctx.completion.errors, start=offset):
            message = f"could not parse your tool call: {error.message}"
            ctx.rejected.append(
                (position, _error_result("", "invalid_tool_call", Status.INVALID, message))
            )

        if ctx.planned:
            ctx.unusable_turns = 0
        elif ctx.rejected:
            ctx.unusable_turns += 1
        status = _stage_status(len(ctx.planned), len(ctx.rejected))
        ctx.log_stage(
            self.name,
            status,
            planned=[p.call.name for p in ctx.planned],
            rejected=[(r.name, r.status_code) for _, r in ctx.rejected],
        )
        ctx.emit(
            "selection",
            status=int(status),
            planned=[{"name": p.call.name, "arguments": p.arguments} for p in ctx.planned],
            rejected=[
                {"name": r.name, "status": r.status_code, "error": r.error} for _, r in ctx.rejected
            ],
        )
        return ctx

    def _refusal(self, ctx: RunContext, call: ToolCall) -> ToolResult | None:
        tool = ctx.tools.get(call.name)
        if tool is None:
            available = ", ".join(ctx.tools) or "(none)"
            where = (
                "is not available in this session"
                if call.name in ctx.all_tool_names
                else "does not exist"
            )
            return _error_result(
                call.id,
                call.name,
                Status.UNKNOWN_TOOL,
                f"tool '{call.name}' {where}; available tools: {available}",
            )
        if not tool.available():
            return _error_result(
                call.id,
                call.name,
                Status.UNKNOWN_TOOL,
                f"tool '{call.name}' is unavailable right now; answer without it or try another",
            )
        arguments, errors = tool.validate(call.arguments)
        if errors:
            return _error_result(
                call.id,
                call.name,
                Status.INVALID,
                "invalid arguments: "
                + "; ".join(errors)
                + ". Call the tool again with fixed arguments.",
            )
        ctx.planned.append(PlannedCall(call, tool, arguments))
        return None


def _error_result(call_id: str, name: str, status: Status, message: str) -> ToolResult:
    return ToolResult(
        call_id=call_id,
        name=name,
        content={"error": message, "status": int(status)},
        status_code=int(status),
        error=message,
    )


def _stage_status(planned: int, rejected: int) -> Status:
    if rejected == 0:
        return Status.OK
    return Status.PARTIAL if planned else Status.INVALID
